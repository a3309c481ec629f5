"""Rule `autopsy`: stage `autopsy` of capacity_pack.stages."""

from capacity_pack.logs import job_logging
from capacity_pack.stages import entry

with job_logging(snakemake.log[0]) as log:
    p = snakemake.params
    entry("autopsy")(
        pack=p.pack,
        results_dir=p.results_dir,
        log_dir=p.log_dir,
        repo_dir=p.repo_dir,
        markdown=snakemake.output.markdown,
        json_path=snakemake.output.json,
        requests=list(snakemake.input.requests),
        log=log,
    )
