"""MKL's AVX2 kernels on AMD processors with AVX2 and without AVX-512, never over the operator's value."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrec.kernelsettings import MKL_CPU_TYPE, prefer_avx2_kernels, wants_avx2_kernels


def cpuinfo(vendor: str, flags: str) -> str:
    """Two processors' worth of /proc/cpuinfo, as Linux writes it."""
    one = f"processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: a processor\nflags\t\t: {flags}\n"
    return one + "\n" + one.replace(": 0", ": 1")


AMD_AVX2 = cpuinfo("AuthenticAMD", "fpu sse sse2 avx fma avx2 bmi2")


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        (AMD_AVX2, True),
        (cpuinfo("AuthenticAMD", "fpu sse sse2 avx fma avx2 avx512f avx512bw"), False),  # its own path
        (cpuinfo("GenuineIntel", "fpu sse sse2 avx fma avx2"), False),  # MKL's own vendor
        (cpuinfo("AuthenticAMD", "fpu sse sse2 avx"), False),  # no AVX2 to take
        ("", False),
    ],
)
def test_only_amd_with_avx2_and_without_avx512_wants_them(text: str, wanted: bool) -> None:
    assert wants_avx2_kernels(text) is wanted


def test_sets_the_variable_on_such_a_processor(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(AMD_AVX2)
    env: dict[str, str] = {}
    assert prefer_avx2_kernels(env, info)
    assert env == {MKL_CPU_TYPE: "5"}


def test_leaves_an_operators_value_and_other_machines_alone(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(AMD_AVX2)
    env = {MKL_CPU_TYPE: "2"}
    assert not prefer_avx2_kernels(env, info)
    assert env == {MKL_CPU_TYPE: "2"}
    info.write_text(cpuinfo("GenuineIntel", "avx fma avx2"))
    env = {}
    assert not prefer_avx2_kernels(env, info)
    assert not prefer_avx2_kernels(env, tmp_path / "missing")
    assert env == {}


def test_commands_run_in_the_test_process_leave_its_kernels_alone() -> None:
    # A command invoked in process (CliRunner) would set the variable for every later test,
    # and MKL's path with it (digests, tolerances): tests/conftest.py keeps it off.
    import streamrec.kernelsettings as ks

    env: dict[str, str] = {}
    assert not ks.prefer_avx2_kernels(env)
    assert env == {}
