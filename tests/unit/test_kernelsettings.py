"""MKL's vector kernels on AMD processors (AVX-512 with Skylake's subsets, else AVX2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrec.kernelsettings import MKL_CPU_TYPE, mkl_cpu_type, prefer_vector_kernels


def cpuinfo(vendor: str, flags: str) -> str:
    """Two processors' worth of /proc/cpuinfo, as Linux writes it."""
    one = f"processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: a processor\nflags\t\t: {flags}\n"
    return one + "\n" + one.replace(": 0", ": 1")


AMD_AVX2 = cpuinfo("AuthenticAMD", "fpu sse sse2 avx fma avx2 bmi2")
AMD_AVX512 = cpuinfo(
    "AuthenticAMD", "fpu avx fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16"
)


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (AMD_AVX2, "5"),
        (AMD_AVX512, "7"),
        # AVX-512 without the subsets MKL's Xeon code uses: its AVX2 code
        (cpuinfo("AuthenticAMD", "fpu sse sse2 avx fma avx2 avx512f avx512bw"), "5"),
        (cpuinfo("GenuineIntel", "fpu sse sse2 avx fma avx2"), None),  # MKL's own vendor
        (cpuinfo("GenuineIntel", "avx fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl"), None),
        (cpuinfo("AuthenticAMD", "fpu sse sse2 avx"), None),  # no AVX2 to take
        (cpuinfo("AuthenticAMD", "fpu sse sse2 avx avx2"), None),  # AVX2 without FMA
        ("", None),
    ],
)
def test_the_path_each_processor_gets(text: str, wanted: str | None) -> None:
    assert mkl_cpu_type(text) == wanted


@pytest.mark.parametrize(("text", "value"), [(AMD_AVX2, "5"), (AMD_AVX512, "7")])
def test_sets_the_variable_on_such_a_processor(tmp_path: Path, text: str, value: str) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    env: dict[str, str] = {}
    assert prefer_vector_kernels(env, info)
    assert env == {MKL_CPU_TYPE: value}


def test_leaves_an_operators_value_and_other_machines_alone(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(AMD_AVX512)
    env = {MKL_CPU_TYPE: "2"}
    assert not prefer_vector_kernels(env, info)
    assert env == {MKL_CPU_TYPE: "2"}
    info.write_text(cpuinfo("GenuineIntel", "avx fma avx2"))
    env = {}
    assert not prefer_vector_kernels(env, info)
    assert not prefer_vector_kernels(env, tmp_path / "missing")
    assert env == {}


def test_commands_run_in_the_test_process_leave_its_kernels_alone() -> None:
    # A command invoked in process (CliRunner) would set the variable for every later test,
    # and MKL's path with it (digests, tolerances): tests/conftest.py keeps it off.
    import streamrec.kernelsettings as ks

    env: dict[str, str] = {}
    assert not ks.prefer_vector_kernels(env)
    assert env == {}
