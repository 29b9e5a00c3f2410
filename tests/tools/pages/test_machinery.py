"""How long the README's commands take, from results/timings: every duration the file has, and no other."""

from tools.pages import machinery

MACHINE = {"device_name": "AMD EPYC", "threads": 2, "cpu_capability": "AVX512", "cpu_native_bf16": True}


def test_the_durations_name_each_measured_command_in_minutes(ctx_with):
    timings = {"_file": "timings.json", "machine": MACHINE, "note": "wall time", "setup_s": 150, "tests_s": 540,
               "main_job_s": 708}
    text = machinery.durations(ctx_with(timings=timings))
    assert text.startswith("On 2 threads of an AMD EPYC (ATen AVX512, native bf16), otherwise idle, the first set-up "
                           "took 2.5 minutes, `tools/test.sh` 9.0 minutes and `tools/compare.sh` 11.8 minutes (how, and the tests' "
                           "count: [`results/timings/timings.json`]")
    older = machinery.durations(ctx_with(timings={"_file": "timings.json", "machine": MACHINE, "tests_s": 524}))
    assert "otherwise idle, `tools/test.sh` 8.7 minutes (how" in older and "set-up" not in older
