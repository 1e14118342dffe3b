"""Which latency providers can answer for a (hardware, model, tp): for `llmsim profiles list`.

Asks every registered provider's ``covers`` (the same test ``--latency-provider auto``
uses), in auto's order: ``measured`` when a bundle for the model's precision and tp exists,
``aic`` when aiconfigurator-core has a database for the hardware, ``roofline`` whenever the
hardware is in the catalogue.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import InputError
from sim.latency.base import AUTO_ORDER, load_providers
from sim.paths import profiles_root, shared_data_root


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


def available_providers(hardware: str, model_name: str, tp: int,
                        profiles_dirs: list[str | os.PathLike] | tuple = ()) -> list[dict]:
    """One dict per provider that can answer: ``{"provider", "source", "detail"}``, in the
    order ``auto`` tries them (the first is what auto picks)."""
    from sim.model import load_model

    try:
        model = load_model(model_name)
    except InputError:
        return []
    reg = load_providers()
    dirs = tuple(str(p) for p in profiles_dirs)
    names = [n for n in AUTO_ORDER if n in reg] + [n for n in reg.names() if n not in AUTO_ORDER]
    out = []
    for name in names:
        if reg.get(name).covers(model, hardware, tp, dirs) is None:
            source = name
            if name == "measured":
                from sim.latency.measured import find_bundle
                source = str(find_bundle(hardware, model, dirs))
            out.append({"provider": name, "source": source,
                        "detail": f"{model.precision}, tp{tp} on {hardware}"})
    return out
