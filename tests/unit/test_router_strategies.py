"""The dispatcher's strategies: one per router path, chosen from the spec, and the tokens
path an object with a public interface that hands what it cannot take to the strategy it
was given (never to router privates)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from pdctl.sdk.lint import lint
from pdctl.sdk.router import Router
from pdctl.sdk.router.replies import Reply, StreamReply
from pdctl.sdk.router.textpath import TextPath
from pdctl.sdk.router.timeline import Timeline
from pdctl.sdk.router.tokens import TokensPath
from pdctl.sdk.spec import FleetSpec

ROUTER_DIR = Path(__file__).resolve().parents[2] / "sdk" / "pdctl" / "sdk" / "router"


def make_router(router: dict[str, Any]) -> Router:
    spec = FleetSpec(
        model={"path": "org/m", "served_name": "tiny"},
        fleet={"mode": "push", "platform": "gpu"},
        prefill=[{"http_port": 18100, "side_channel_port": 5600, "devices": [0]}],
        decode=[{"http_port": 18200, "side_channel_port": 5700, "devices": [1]}],
        router={"port": 18300, **router},
        render=[{"http_port": 18400}] if router.get("path") == "tokens" else [],
    )
    plan = lint(spec, check_bound_ports=False).plan
    assert plan is not None
    return Router(spec, plan)


class Recorded:
    """A strategy that records what it was handed."""

    name = "recorded"

    def __init__(self) -> None:
        self.got: list[str] = []

    async def route(self, path: str, body: dict[str, Any], tl: Timeline) -> Reply | StreamReply:
        self.got.append(path)
        return Reply(200, b"{}")


def test_the_strategy_follows_router_path():
    assert isinstance(make_router({}).dispatcher.strategy(), TextPath)
    assert isinstance(make_router({"path": "tokens"}).dispatcher.strategy(), TokensPath)


async def test_tokens_hands_other_endpoints_to_its_fallback():
    router = make_router({"path": "tokens"})
    tokens = router.dispatcher.tokens
    assert isinstance(tokens, TokensPath)
    tokens.fallback = fallback = Recorded()
    tl = Timeline.begin(router.instances.mode, "/v1/embeddings", False)
    reply = await tokens.route("/v1/embeddings", {"input": "x"}, tl)
    assert isinstance(reply, Reply)
    assert fallback.got == ["/v1/embeddings"]


async def test_tokens_without_a_render_server_falls_back_or_answers_503():
    for fallback_mode, expect in (("text", ["/v1/completions"]), ("error", [])):
        router = make_router({"path": "tokens", "render_fallback": fallback_mode})
        for u in router.instances.renders:
            router.instances.mark(u, False)
        tokens = router.dispatcher.tokens
        assert isinstance(tokens, TokensPath)
        tokens.fallback = fallback = Recorded()
        reply = await router.dispatcher.dispatch("/v1/completions", {"prompt": "x"})
        assert fallback.got == expect
        if fallback_mode == "text":
            assert router.recent() == []  # the fallback answered; nothing failed
        else:
            assert isinstance(reply, Reply)
            assert reply.status == 503
            assert router.recent()[0]["outcome"] == "error"


def test_strategies_use_only_public_names_of_other_objects():
    """No ``x._name`` on anything but ``self`` in the strategy and routing modules."""
    for name in ("textpath.py", "tokens.py", "dispatch.py", "relay.py", "legs.py"):
        tree = ast.parse((ROUTER_DIR / name).read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                owner = node.value
                where = f"{name}:{node.lineno} reaches into a private {node.attr}"
                assert isinstance(owner, ast.Name), where
                assert owner.id == "self", where
