"""How a page names the machine behind a result."""

from tools.pages.sources import cpu_words

XEON = {"device": "cpu", "device_name": "Intel(R) Xeon(R) Processor", "threads": 2, "cpu_native_bf16": True,
        "cpu_capability": "AVX512"}


def test_the_cpu_its_kernels_and_bf16_are_named():
    assert cpu_words(XEON) == "2 threads of an Intel Xeon (ATen AVX512, native bf16)"
    assert cpu_words(None) == "a CPU not recorded"


def test_an_allocator_other_than_the_c_librarys_is_named():
    named = "2 threads of an Intel Xeon (ATen AVX512, native bf16, tcmalloc)"
    assert cpu_words({**XEON, "cpu_allocator": "tcmalloc"}) == named
    assert cpu_words({**XEON, "cpu_allocator": "libc"}) == cpu_words(XEON)
