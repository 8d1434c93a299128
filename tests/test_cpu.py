"""What the CPU offers: its flags read from /proc/cpuinfo, and the predicates built on them."""

import os

import pytest

from verispec import cpu


def test_flags_are_read_from_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512_bf16 amx_tile amx_int8\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    flags = cpu.cpu_flags(str(info))
    assert flags == frozenset({"fpu", "avx2", "avx512_bf16", "amx_tile", "amx_int8"})
    assert cpu.cpu_has_amx_int8(flags) and cpu.cpu_has_native_bf16(flags)
    assert not cpu.cpu_has_amx_int8(frozenset({"amx_tile"}))  # tiles without int8 products
    assert not cpu.cpu_has_native_bf16(frozenset({"avx512f"}))
    assert cpu.cpu_has_avx512_vnni(frozenset({"avx512f", "avx512bw", "avx512_vnni", "avx2"}))
    assert not cpu.cpu_has_avx512_vnni(frozenset({"avx2", "avx_vnni"}))  # AVX-VNNI is 256 bits only
    assert cpu.cpu_has_wide_layout(frozenset({"avx512f", "avx512bw", "avx512_vnni", "avx2", "fma", "f16c"}))
    assert cpu.cpu_has_wide_layout(frozenset({"avx2", "fma", "f16c"}))  # Zen 2: the AVX2 kernel
    assert not cpu.cpu_has_wide_layout(frozenset({"avx2", "fma", "f16c", "avx_vnni"}))  # Alder Lake
    assert not cpu.cpu_has_wide_layout(frozenset({"avx", "sse4_2"}))
    assert cpu.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_the_native_kernels_run_amx_exactly_where_the_cpu_lists_it():
    # The kernels decide at build (-march=native) and at run time (the tile state granted);
    # the llama.cpp backend decides from the flags. Both must see the same CPU.
    from verispec.native import kernels

    if "0" in (os.environ.get("VERISPEC_AMX"), os.environ.get("VERISPEC_WIDE")):
        pytest.skip("VERISPEC_AMX=0 or VERISPEC_WIDE=0 keeps the tiles or the wide layout out")
    module = kernels.load()
    assert module is not None, kernels.build_error()
    assert module.amx_available() == cpu.cpu_has_amx_int8()
    assert module.wide_available() == cpu.cpu_has_wide_layout()
