"""``roundgate serve``: a local Ray cluster on loopback running a ``serve run`` config.

Merges the command line's overrides into the config's args (``apply_overrides``), validates
them once (``app_args``: an ``AppArgs``, the engine's ``ServerArgs`` inside it), sets the
environment that keeps every Ray socket on 127.0.0.1 before Ray is imported, deploys the
application built from that validated object, prints a ready line, and on Ctrl-C / SIGTERM
shuts Serve and Ray down so no process is left behind.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from roundgate.gate import registry

if TYPE_CHECKING:  # pydantic and the engine's imports are only needed once args are validated
    from roundgate.deployment.config import AppArgs

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "GLOO_SOCKET_IFNAME": "lo",
}
DEFAULT_CONFIG = Path(__file__).parent / "configs" / "local.yaml"


def load_config(path: Path) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"--config {path}: invalid YAML ({exc})") from exc
    apps = (cfg or {}).get("applications") or []
    if len(apps) != 1 or "args" not in apps[0]:
        raise ValueError(f"--config {path}: expected one application with args")
    try:
        http_options(cfg)  # refused here, before Ray starts
    except ValueError as exc:
        raise ValueError(f"--config {path}: {exc}") from exc
    return cfg


def use_loopback_env() -> None:
    """Keep every Ray socket on 127.0.0.1: must run before ``ray`` is first imported."""
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)


def start_local_cluster(num_cpus: int | None = None) -> None:
    """``ray.init`` of a new cluster on loopback, without the dashboard (call before any
    other Ray use). ``address="local"``: a bare ``ray.init()`` joins the cluster named in
    Ray's ``ray_current_cluster`` file instead, which a ``ray start`` (or a test cluster) that
    died without cleaning up leaves behind; joining a cluster is ``join_cluster``'s, asked
    for with ``--address``."""
    use_loopback_env()
    import ray

    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        configure_logging=True,
        logging_level="WARNING",
    )


def join_cluster(address: str) -> None:
    """Connect to a running Ray cluster (``ray start --head`` and its workers, KubeRay's)
    instead of starting one: its nodes, resources and Serve are the deployment's."""
    use_loopback_env()
    import ray

    ray.init(address=address, configure_logging=True, logging_level="WARNING")


def apply_overrides(cfg: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``cfg`` whose application args take ``overrides`` (engine and app keys, by
    name, as ``roundgate serve``'s flags give them); ``cfg`` is left as it was.

    Two keys bring along what they imply, so that a flag never fights the file:

    - a prefill policy the overrides select (``prefill_policy``, or the policy whose flags
      they give) drops the file's flags of other policies, and the file's ``prefill_policy``
      when the overrides' flags imply theirs;
    - ``device: cuda`` with no GPU reserved per rank, by the file or the overrides, reserves
      one (``num_gpus_per_rank: 1``): a rank Ray gives no GPU sees none.

    >>> cfg = {"applications": [{"args": {"dp_size": 2, "prefill_attempt_interval": 4}}]}
    >>> apply_overrides(cfg, {"prefill_policy": "none"})["applications"][0]["args"]
    {'dp_size': 2, 'prefill_policy': 'none'}
    """
    out = copy.deepcopy(cfg)
    args = out["applications"][0]["args"]
    policy = _selected_policy(overrides)
    if policy is not None:
        _drop_other_policies(args, policy, keep_named="prefill_policy" in overrides)
        if isinstance(args.get("engine"), dict):
            _drop_other_policies(args["engine"], policy, keep_named="prefill_policy" in overrides)
    args.update(overrides)
    if overrides.get("device") == "cuda" and not _gpus_reserved(args):
        args["num_gpus_per_rank"] = 1
    return out


def _selected_policy(overrides: Mapping[str, Any]) -> str | None:
    """The prefill policy ``overrides`` select: named, else the owner of a policy flag given."""
    if overrides.get("prefill_policy") is not None:
        return str(overrides["prefill_policy"])
    owners = registry.all_flags()
    given = [owners[name][1] for name, v in overrides.items() if name in owners and v is not None]
    return given[0] if given else None


def _drop_other_policies(args: dict[str, Any], policy: str, keep_named: bool) -> None:
    owners = registry.all_flags()
    for name in [n for n in args if n in owners and owners[n][1] != policy]:
        del args[name]
    if not keep_named and args.get("prefill_policy") not in (None, policy):
        del args["prefill_policy"]


def _gpus_reserved(args: Mapping[str, Any]) -> bool:
    if args.get("num_gpus_per_rank"):
        return True
    sections = [args.get(role) for role in ("prefill", "decode")]
    return any(isinstance(s, dict) and s.get("num_gpus_per_rank") for s in sections)


def app_args(cfg: dict[str, Any], overrides: Mapping[str, Any] | None = None) -> AppArgs:
    """The config's application args with ``overrides``, validated once (``AppArgs``, its
    ``ServerArgs`` inside): what ``build_app`` takes as is. Needs no cluster."""
    from roundgate.deployment.config import AppArgs

    merged = apply_overrides(cfg, overrides or {})
    return AppArgs.model_validate(merged["applications"][0]["args"])


def build(cfg: dict[str, Any], overrides: Mapping[str, Any] | None = None) -> Any:
    """The config's application, its args validated once (``app_args``); needs no cluster."""
    args = app_args(cfg, overrides)  # refused (naming the flag) before Ray is imported
    from roundgate.deployment.app import build_app

    return build_app(args)


def deploy(
    cfg: dict[str, Any],
    overrides: Mapping[str, Any] | None = None,
    blocking: bool = False,
    app: Any = None,
):
    """Start Serve on the config's HTTP address and run its one application (``app``, when
    already built, else built here)."""
    from ray import serve

    app_cfg = cfg["applications"][0]
    if app is None:
        app = build(cfg, overrides)
    serve.start(
        # The config's proxies (``HeadOnly``: one HTTP door, on the head node; Serve's default
        # puts one on every node, so a lost node would drop the connections it took).
        proxy_location=cfg.get("proxy_location"),
        http_options=http_options(cfg),
    )
    return serve.run(
        app,
        name=app_cfg.get("name", "roundgate"),
        route_prefix=app_cfg.get("route_prefix", "/"),
        blocking=blocking,
    )


def http_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """Serve's HTTP options from the config's ``http_options``: host, port, and the request
    timeout (``request_timeout_s``: seconds after which the proxy ends a request, a stream
    included, with a 408; absent: none), checked here so a bad value names its key."""
    http = cfg.get("http_options") or {}
    options: dict[str, Any] = {
        "host": http.get("host", "127.0.0.1"),
        "port": int(http.get("port", 8000)),
    }
    timeout = http.get("request_timeout_s")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(
                f"http_options.request_timeout_s must be a number of seconds > 0, got {timeout!r}"
            )
        options["request_timeout_s"] = float(timeout)
    return options


def config_url(cfg: dict[str, Any]) -> str:
    """The base URL the config's HTTP options serve on."""
    http = cfg.get("http_options") or {}
    return f"http://{http.get('host', '127.0.0.1')}:{http.get('port', 8000)}"


def each_deployment(
    cfg: dict[str, Any],
    overrides: dict[str, dict[str, Any]],
    run: Callable[[str], None],
    configs: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Start the local cluster, deploy ``cfg`` with each entry of ``overrides`` in turn and,
    once it answers, call ``run(label)``; then each of ``configs`` (whole configs on the same
    address, e.g. a P/D one) the same way. Serve and Ray are shut down however it ends."""
    start_local_cluster()
    import ray
    from ray import serve

    url = config_url(cfg)
    plan = [(label, cfg, extra) for label, extra in overrides.items()]
    plan += [(label, other, {}) for label, other in (configs or {}).items()]
    try:
        for label, config, extra in plan:
            if config_url(config) != url:
                raise ValueError(f"config {label!r} serves on {config_url(config)}, not {url}")
            deploy(config, extra)
            wait_ready(url)
            run(label)
    finally:
        shutdown(serve, ray)


def wait_ready(url: str, timeout_s: float = 180.0) -> None:
    """Poll with a one-token completion until the deployment answers 200."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = httpx.post(
                f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 1}, timeout=10
            )
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"deployment at {url} not ready in {timeout_s:.0f}s")


def shutdown(serve: Any, ray: Any, timeout_s: float = 20.0) -> None:
    """Stop Serve, then the local Ray cluster, even if part of it is already gone.

    A terminal's Ctrl-C (or a group-wide SIGTERM) also reaches Ray's own daemons; when the
    raylet is dead ``serve.shutdown`` would wait forever, so it gets a bounded thread and
    ``ray.shutdown`` (which kills the processes this driver started) always runs.
    """
    t = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
    t.start()
    t.join(timeout_s)
    ray.shutdown()


def serve_forever(
    config: Path, overrides: Mapping[str, Any] | None = None, address: str | None = None
) -> int:
    """Deploy ``config`` with ``overrides`` (``apply_overrides``) and serve until a signal.
    ``address``: on that running cluster (stopping removes only this application and leaves
    the cluster up); else on a local cluster started here and shut down after."""
    cfg = load_config(config)
    use_loopback_env()
    app = build(cfg, overrides)  # every refusal before any cluster starts
    if address:
        join_cluster(address)
    else:
        start_local_cluster()
    import ray
    from ray import serve

    # A plain flag: setting a threading.Event from a signal handler can deadlock against the
    # main thread's own wait on that Event.
    stopping: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    name = cfg["applications"][0].get("name", "roundgate")
    try:
        deploy(cfg, app=app)
        url = config_url(cfg)
        where = f"the cluster at {address}" if address else "a local cluster"
        print(
            f"roundgate ready on {url} ({where}; Ctrl-C to stop)\n"
            f"  curl {url}/v1/completions -H 'Content-Type: application/json' "
            '-d \'{"prompt": "Hello", "max_tokens": 16}\'',
            flush=True,
        )
        while not stopping:
            time.sleep(0.2)
    finally:
        print("roundgate: shutting down", file=sys.stderr, flush=True)
        if address:
            leave_cluster(serve, ray, name)
        else:
            shutdown(serve, ray)
    return 0


def leave_cluster(serve: Any, ray: Any, name: str, timeout_s: float = 60.0) -> None:
    """Remove application ``name`` from a cluster this process joined, then disconnect:
    Serve, the cluster and other applications stay up."""
    t = threading.Thread(target=serve.delete, args=(name,), name="serve-delete", daemon=True)
    t.start()
    t.join(timeout_s)
    ray.shutdown()
