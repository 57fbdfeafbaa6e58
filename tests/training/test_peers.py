"""A collective that lost its peer is told apart from a real error of this process."""

from __future__ import annotations

import pytest

from ampbench.training import peers

GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
    "[127.0.0.1]:47323: Connection reset by peer. This is typically caused by a remote worker hanging"
)


def test_a_gloo_peer_reset_in_a_job_of_two_is_a_lost_peer(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert peers.lost_peer(RuntimeError(GLOO)) == "Read error [127.0.0.1]:47323: Connection reset by peer"


def test_a_lost_peer_is_found_in_the_chain(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    try:
        try:
            raise RuntimeError(GLOO)
        except RuntimeError as inner:
            raise ValueError("while saving") from inner
    except ValueError as outer:
        assert peers.lost_peer(outer) is not None


@pytest.mark.parametrize(
    ("world", "err"),
    [("1", RuntimeError(GLOO)), ("2", RuntimeError("CUDA out of memory")), ("2", ValueError("bad"))],
)
def test_anything_else_is_not_a_lost_peer(monkeypatch, world, err):
    monkeypatch.setenv("WORLD_SIZE", world)
    assert peers.lost_peer(err) is None
