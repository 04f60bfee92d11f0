from flashkit.core import hostinfo


def test_mem_gib_reads_memtotal_rounding_down(tmp_path):
    p = tmp_path / "meminfo"
    p.write_text("MemTotal:       24676408 kB\nMemFree:         1000 kB\n")
    assert hostinfo.mem_gib(p) == 23


def test_mem_gib_falls_back_to_sysconf(tmp_path):
    assert hostinfo.mem_gib(tmp_path / "missing") >= 1
