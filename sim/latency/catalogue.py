"""Which latency providers can answer for a (hardware, model, tp): for `llmsim profiles list`.

- ``roofline`` whenever the hardware is in the catalogue (profiles/hardware/);
- ``measured`` when a bundle folder ``<dir>/<HW>/<org>/<model>/<variant>/tp<N>`` exists in
  one of the search dirs (the given ones, the project's ``profiles/bundles/`` and
  ``../shared/data/profiles`` when present);
- ``aic`` when the optional ``aiconfigurator`` package imports.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from sim.errors import InputError
from sim.hardware import load_hardware
from sim.paths import profiles_root, shared_data_root

_VARIANTS = ("bf16", "fp16", "fp8", "fp32")


def bundle_dirs(profiles_dirs=()) -> list[Path]:
    dirs = [Path(p) for p in profiles_dirs]
    dirs += [profiles_root() / "bundles", shared_data_root() / "profiles"]
    seen, out = set(), []
    for d in dirs:
        key = str(d.resolve()) if d.exists() else str(d)
        if key not in seen and d.is_dir():
            seen.add(key)
            out.append(d)
    return out


def _model_names(model_name: str) -> list[str]:
    names = [model_name]
    try:
        from sim.model import load_model

        spec = load_model(model_name)
        names += [spec.name, *spec.aliases]
    except InputError:
        pass
    return list(dict.fromkeys(names))


def available_providers(hardware: str, model_name: str, tp: int,
                        profiles_dirs: list[str | os.PathLike] | tuple = ()) -> list[dict]:
    """One dict per provider that can answer: ``{"provider", "source", "detail"}``."""
    out: list[dict] = []
    hw_name = hardware
    try:
        spec = load_hardware(hardware)
        hw_name = spec.name
        out.append({"provider": "roofline", "source": f"roofline({spec.name})",
                    "detail": f"calibrated roofline on the {spec.name} datasheet spec"})
    except InputError:
        pass
    hw_folders = list(dict.fromkeys([hardware, hw_name]))
    for d in bundle_dirs(profiles_dirs):
        for hw in hw_folders:
            for name in _model_names(model_name):
                for variant in _VARIANTS:
                    tp_dir = d / hw / name / variant / f"tp{tp}"
                    if tp_dir.is_dir():
                        out.append({"provider": "measured", "source": str(tp_dir.parent),
                                    "detail": f"measured bundle, variant {variant}, tp{tp}"})
    if importlib.util.find_spec("aiconfigurator") is not None:
        out.append({"provider": "aic", "source": "aiconfigurator",
                    "detail": "aiconfigurator per-op database (coverage checked when built)"})
    return out
