"""The pack's vocabulary, defined once: what every report, drill and surface means by a word.

Each module here is the one home of a concept the rest of the library shares (a percentile is
:mod:`.percentile`'s nearest rank everywhere: a point's P95, a drill window's P95 and a trace's
P95 are the same statistic; a decision is :mod:`.words`' sentence on the console, in the README,
on the HTML page, in the MLflow description and in ``capacity-pack compare``). The package sits
under every other layer: it imports only the standard library and numpy, so the analyzer's path
stays free of pandas.
"""
