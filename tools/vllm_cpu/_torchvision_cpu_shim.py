"""Let a CUDA-built torchvision wheel import beside CPU torch.

torchvision's _meta_registrations.py calls torch.library.register_fake("torchvision::nms"/"::qnms") at import.
When torchvision/_C.so cannot load (CUDA build beside CPU torch) those operators are undeclared and the import
dies with "RuntimeError: operator torchvision::nms does not exist" -- which breaks transformers' image_utils and
hence transformers.modeling_utils and vLLM's model registry.  This module, imported from a .pth file at every
interpreter start, installs a one-shot meta-path hook: on the first `import torchvision` (and only then -- it never
imports torch otherwise) it tries to load torchvision/_C.so itself; if that works nothing is changed, otherwise it
declares the two schemas (no kernels) so the fake registrations succeed.  Calling the ops still fails, as it would.
"""
import sys

_LIBS = []  # keep torch.library.Library objects alive (their defs vanish when collected)
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _declare_missing_ops(spec_locations):
    import os
    import torch
    for loc in spec_locations or ():
        so = os.path.join(loc, "_C.so")
        if os.path.exists(so):
            try:
                torch.ops.load_library(so)
                return  # a matching build: its own ops are registered
            except (OSError, ImportError, RuntimeError):
                break
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        name = schema.split("(", 1)[0]
        if not _op_exists(name):
            lib.define(schema)
    _LIBS.append(lib)


def _op_exists(name):
    import torch
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


class _TorchvisionHook:
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        import importlib.util
        spec = importlib.util.find_spec("torchvision")
        if spec is not None:
            try:
                _declare_missing_ops(spec.submodule_search_locations)
            except Exception as e:  # never break interpreter start-up or the import itself
                print(f"[torchvision shim] {type(e).__name__}: {e}", file=sys.stderr)
        return spec


if not any(type(f).__name__ == "_TorchvisionHook" for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionHook())
