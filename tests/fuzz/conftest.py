"""Hypothesis profiles of the fuzz tests (docs/explanation/tests.md, "Fuzzing the readers").

"ci" (the default): a few hundred examples per reader, derandomised so CI sees the same inputs on
every run; all fuzz tests together stay under a minute on 2 CPU cores. "long" (ATTNRES_FUZZ=long):
thousands of examples per reader (ATTNRES_FUZZ_EXAMPLES=N sets another number), random each run, for
a local search. Neither has a deadline (the machine may be shared; `tests.fuzz.helpers.bounded` is the
hang check) and neither keeps an example database, so nothing is written into the repository.
"""

import atexit
import os
import shutil
import tempfile

from hypothesis import HealthCheck, Phase, settings
from hypothesis.configuration import set_hypothesis_home_dir

PROFILE_ENV = "ATTNRES_FUZZ"
EXAMPLES_ENV = "ATTNRES_FUZZ_EXAMPLES"  # the long profile's examples per test, to fit a time budget
CI_EXAMPLES = 200
LONG_EXAMPLES = 5000

# Hypothesis keeps a few files of its own under its home directory (.hypothesis/ in the working
# directory by default) even without a database: a temporary one keeps them out of the repository.
_HOME = tempfile.mkdtemp(prefix="attnres-hypothesis-")
set_hypothesis_home_dir(_HOME)
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)

# No explain phase: it replays a failure under sys.settrace, which makes a deep input time out.
_COMMON = dict(deadline=None, database=None, print_blob=True, phases=[p for p in Phase if p != Phase.explain],
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=int(os.environ.get(EXAMPLES_ENV, LONG_EXAMPLES)), **_COMMON)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))
