"""Fixtures the session tests share."""
import pytest


@pytest.fixture
def cpu_target_and_fresh_log(monkeypatch):
    """Rewrites for this CPU, and every said-once line said again."""
    from tfamp_rewrite.training import devices, shadow_graph

    monkeypatch.setenv("TFAMP_REWRITE_TARGET", "cpu")
    monkeypatch.setattr(devices, "_logged", set())
    monkeypatch.setattr(shadow_graph, "_SAID_SUMMARIES", set())


@pytest.fixture
def emulated_numerics(monkeypatch):
    """Half numerics emulated on this CPU (rounding to half after each converted node)."""
    monkeypatch.setenv("TFAMP_REWRITE_NUMERICS", "emulate")
