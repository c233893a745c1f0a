"""Ports: every server and rendezvous port comes from slime's range, with SGLang's derived ports valid.

SGLang 0.5.15.post1 refuses to start when ``--port + 10000`` exceeds 65535, so a port from the OS's
ephemeral range (32768-60999 by default, often higher) kills about one engine start in five.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from slime_ref.utils.net import SGLANG_DERIVED_PORT_OFFSETS, PortAllocator, is_port_free


def test_ports_come_from_the_base_upward_and_skip_busy_ones(tmp_path):
    allocator = PortAllocator(base=23000, lock_dir=tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy_port = busy.getsockname()[1]
        around_busy = PortAllocator(base=busy_port, lock_dir=tmp_path / "other")
        assert around_busy.allocate() != busy_port  # bound by someone else: skipped
    first, second = allocator.allocate(), allocator.allocate()
    assert 23000 <= first < second < 23100


def test_a_port_whose_derived_ports_are_out_of_range_or_busy_is_skipped(tmp_path):
    near_top = PortAllocator(base=65535 - 10000 - 1, lock_dir=tmp_path)
    assert near_top.allocate(derived=(10000,)) == 55534
    assert near_top.allocate(derived=(10000,)) == 55535
    with pytest.raises(OSError, match=r"no free port from 55534 up"):
        near_top.allocate(derived=(10000,))  # 55536 + 10000 > 65535: nothing left above the base
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        allocator = PortAllocator(base=port - 1, lock_dir=tmp_path / "busy")
        assert allocator.allocate(derived=(1,)) not in (port - 1, port)  # port - 1's +1 is busy


def test_two_processes_never_get_the_same_port(tmp_path):
    """Engine and train actors allocate in separate processes; a lock file per port keeps them apart."""
    code = textwrap.dedent(f"""
        from slime_ref.utils.net import PortAllocator
        a = PortAllocator(base=24000, lock_dir={str(tmp_path)!r})
        print([a.allocate() for _ in range(5)], flush=True)
        input()  # hold the ports until told to exit
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        got = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)
    assert not set(got[0]) & set(got[1]), got
    # once they exit, their ports are free for the next run
    assert PortAllocator(base=24000, lock_dir=tmp_path).allocate() == 24000


def test_release_hands_a_port_out_again(tmp_path):
    allocator = PortAllocator(base=25000, lock_dir=tmp_path)
    port = allocator.allocate(derived=(1,))
    allocator.release(port, (1,))
    assert PortAllocator(base=25000, lock_dir=tmp_path).allocate() == port
    assert is_port_free(port)


def _netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _netns_available(), reason="needs `unshare -n` (root) for a private network namespace")
def test_engines_router_and_rendezvous_ports_are_valid_for_sglang_with_a_high_os_port_range(tiny, tmp_path):
    """In a private network namespace whose ephemeral range is 60000-65000 (so any port the OS picks
    has port + 10000 > 65535), a launch still gives every engine a port SGLang accepts."""
    probe = textwrap.dedent(f"""
        import json
        from urllib.parse import urlparse
        from slime_ref.rollout.servers import RolloutServers
        from slime_ref.utils.net import allocate_port
        with RolloutServers({str(tiny.model_dir)!r}, log_dir={str(tmp_path / "logs")!r}, num_engines=2) as s:
            ports = {{"engines": [urlparse(u).port for u in s.engine_urls], "router": urlparse(s.router_url).port,
                      "rendezvous": allocate_port()}}
        print(json.dumps(ports))
    """)
    script = ("ip link set lo up && echo '60000 65000' > /proc/sys/net/ipv4/ip_local_port_range && "
              f"exec {sys.executable} -c {_shell_quote(probe)}")
    # a lock directory of its own: the namespace's ports are not the host's
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    ports = json.loads(result.stdout.strip().splitlines()[-1])
    for port in ports["engines"]:
        assert 15000 <= port < 60000  # slime's range, not the OS's
        assert all(port + d <= 65535 for d in SGLANG_DERIVED_PORT_OFFSETS)  # SGLang's start-up check passes
    assert 15000 <= ports["router"] < 60000 and 15000 <= ports["rendezvous"] < 60000
    assert len({*ports["engines"], ports["router"], ports["rendezvous"]}) == 4


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
