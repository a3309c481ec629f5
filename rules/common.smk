# Paths, point lists and the hashes that decide what reruns.
#
# A rule's params carry the sha256 of exactly the manifest sections it reads and of the library
# modules it runs; its frozen-manifest input is ancient(), so a rerun of `freeze` (any manifest
# change) reruns a downstream job only when one of *its* sections or modules changed.
import importlib.util

from capacity_pack import schedule as schedule_lib
from capacity_pack.io import canonical_json, sha256_hex, sha256_of_obj

RESULTS_ROOT = "results"
RESULTS = f"{RESULTS_ROOT}/{PACK.pack.name}"
FROZEN = f"{RESULTS}/manifest/frozen.json"
MANIFEST_JSON = canonical_json(PACK.model_dump(mode="json"))
SECTION_SHA = PACK.section_hashes()
POINTS = schedule_lib.points(PACK)


wildcard_constraints:
    point=r"open-r[0-9.]+|closed-c[0-9]+|exp-[a-z][a-z0-9_]*",
    cache=r"cold|warm",
    repeat=r"[0-9]+",


def sections_hash(*names):
    return sha256_of_obj({n: SECTION_SHA[n] for n in names})


def code_hash(*modules):
    """sha256 of the library modules a rule runs (a changed module reruns that stage)."""
    h = []
    for m in modules:
        spec = importlib.util.find_spec(f"capacity_pack.{m}")
        h.append(sha256_hex(Path(spec.origin).read_bytes()))
    return sha256_of_obj(h)


def point_spec_hash(wildcards):
    """Hash of the manifest content that defines one point beyond its wildcards."""
    point = schedule_lib.Point.parse(wildcards.point, wildcards.cache, int(wildcards.repeat))
    if point.mode == "closed":
        spec = {
            k: PACK.sweep.model_dump()[k]
            for k in ("closed_loop_requests_per_worker", "closed_loop_min_requests")
        }
    elif point.mode == "exp":
        spec = [e.model_dump(mode="json") for e in PACK.experiments if e.name == point.experiment]
    else:
        spec = {}
    return sha256_of_obj(spec)


def point_dir(kind, point):
    return f"{RESULTS}/{kind}/{point.point_id}/{point.cache_state}/rep{point.repeat}"


def schedule_targets():
    return [f"{point_dir('schedules', p)}/summary.json" for p in POINTS]


def all_targets():
    return [FROZEN, *schedule_targets()]
