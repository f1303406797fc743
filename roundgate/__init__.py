"""roundgate: attention-data-parallel LLM serving on Ray, built around a group prefill gate.

One import package. Its subpackages are the repository's top-level folders, mapped into this
namespace (``setup.py``), so the wheel installs this one name and nothing beside it:

- ``roundgate.gate``: the prefill-gating policies, pure (no torch, no Ray, no clocks): the
  gathered rows, a policy's vote, the policy interface, the registry of policies by name.
- ``roundgate.actors``: one rank: the control plane (scheduler, KV pool, round loop; no torch),
  the model, and the Ray Serve replica around them.
- ``roundgate.kernels``: attention and MoE kernels (torch, Triton, the optional GPU libraries).
- ``roundgate.routing``: where a request goes: the routing policies (no Ray) and their registry,
  run by the Serve routers and the simulator alike.
- ``roundgate.sim``: the simulator of a DP group's rounds (the same control plane, no torch).
- ``roundgate.deployment``: the Ray Serve application: the OpenAI API ingress, the routers, P/D.
- ``roundgate.k8s``: offline tooling for the KubeRay manifests (render, validate, generate).
- ``roundgate.dashboards``: the Grafana dashboards as code.
- ``roundgate.nccl_log``: an nccl-tests run, read (stdlib only).
- ``roundgate.bench``: the load generator behind ``roundgate bench``.
- ``roundgate.cli``: the ``roundgate`` command line.

``kernels/`` is a namespace portion (no ``__init__.py``): a Python started in the checkout has
the checkout on its path (``python -m``, ``serve run``'s app dir, the cwd Ray hands its
workers), and a regular package named ``kernels`` there would hide Hugging Face's ``kernels``,
which transformers imports; a portion never hides an installed package of the same name. The
other folders are regular packages (``roundgate.gate`` exports the gate's public names).
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# A source checkout (an editable install, or the tree on the path): the subpackages are the
# folders beside this one. An installed wheel holds them inside this folder instead.
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "setup.py").is_file() and (_checkout / "gate").is_dir():
    __path__.append(str(_checkout))
