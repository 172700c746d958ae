"""The structure drawn from the includes (docs/ARCHITECTURE.md): every module (a folder of src/) includes only
modules on a lower floor, so there is no cycle between folders and no import that runs back up. deltafin.h, the
public API, includes nothing of ours and may be included from anywhere (error codes, options)."""
import pathlib
import re

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# floor of each module: a module may include only modules on a strictly lower floor
FLOORS = {
    "util": 1,
    "format": 2,
    "backend": 3, "store": 3, "hub": 3, "tok": 3, "grammar": 3,
    "model": 4,
    "core": 5,
    "server": 6,
    "cli": 7,
    "main": 8,
}


def module_of(path):
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else "main"


def edges():
    out = set()
    for p in SRC.rglob("*"):
        if p.suffix not in (".c", ".h"):
            continue
        src = module_of(p)
        for inc in re.findall(r'#include "([^"]+)"', p.read_text()):
            if inc == "deltafin.h":
                continue
            dst = inc.split("/")[0]
            if dst != src:
                out.add((src, dst, p.relative_to(SRC).as_posix(), inc))
    return out


def test_every_module_has_a_floor():
    mods = {module_of(p) for p in SRC.rglob("*.c")}
    assert mods <= set(FLOORS), f"modules without a floor in this test: {mods - set(FLOORS)}"


def test_includes_only_go_down():
    bad = [f"{f} includes {inc} ({s} on floor {FLOORS[s]} -> {d} on floor {FLOORS.get(d)})"
           for s, d, f, inc in sorted(edges()) if FLOORS.get(d, 99) >= FLOORS[s]]
    assert not bad, "imports that run sideways or back up:\n" + "\n".join(bad)


def test_public_header_includes_nothing_of_ours():
    api = (SRC.parent / "include" / "deltafin.h").read_text()
    assert not re.findall(r'#include "', api)
