"""Pure logic of the node agent's loopback pod-IP allocation (no cluster needed)."""

import pytest
from nightjar_operator.testing.fake_kubelet import IpAllocator, loopback_pool


def test_pool_starts_at_2_and_skips_network_and_broadcast_octets():
    pool = loopback_pool()
    first = [next(pool) for _ in range(260)]
    assert first[:3] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert "127.0.0.255" not in first and "127.0.1.0" not in first
    assert first[253] == "127.0.1.1"


def test_distinct_ips_reuse_after_free_and_stable_per_uid():
    a = IpAllocator()
    assert [a.get("p1"), a.get("p2"), a.get("p3")] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert a.get("p2") == "127.0.0.3"  # same pod, same IP
    assert a.free("p2") == "127.0.0.3"
    assert a.get("p4") == "127.0.0.3"  # freed IP goes to the next pod
    assert a.free("missing") is None


def test_requested_ip_list_first_free_wins_and_avoids_pool():
    a = IpAllocator()
    assert a.get("x", "127.0.0.2") == "127.0.0.2"
    assert a.get("y") == "127.0.0.3"  # the pinned IP is not handed out again
    assert a.get("z", "127.0.0.2, 127.0.5.5") == "127.0.5.5"
    assert a.get("w", "127.0.0.2,127.0.5.5") == "127.0.0.2"  # all taken: share the first


def test_requested_ip_must_be_loopback():
    with pytest.raises(ValueError, match="nightjar.dev/test-pod-ip"):
        IpAllocator().get("x", "10.1.2.3")


def test_build_recipe_matches_build_script():
    import re
    from pathlib import Path

    from nightjar_operator.testing.cluster import BUILD_RECIPE

    script = (Path(__file__).parents[2] / "scripts" / "k8s" / "build-apiserver.sh").read_text()
    assert re.search(r'^RECIPE="(.*)"$', script, re.M).group(1) == BUILD_RECIPE
