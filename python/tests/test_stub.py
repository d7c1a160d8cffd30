"""braid/_braid.pyi names exactly what the extension module holds: its classes with their members, its functions."""
import ast
import inspect
from pathlib import Path

import braid._braid as extension


def stub_names():
    tree = ast.parse(Path(extension.__file__).with_name("_braid.pyi").read_text())
    top, members = set(), {}

    def collect(body, into, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                into.add(node.name)
                if isinstance(node, ast.ClassDef):
                    members[prefix + node.name] = inner = set()
                    collect(node.body, inner, prefix + node.name + ".")
            elif isinstance(node, ast.Assign):
                into.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # constants: `NAME: int = 16`
                into.add(node.target.id)
            elif isinstance(node, ast.ImportFrom) and node.module == "braid._error":
                into.update(alias.asname or alias.name for alias in node.names)
    collect(tree.body, top, "")
    return top, members


def public(names):
    return {n for n in names if not n.startswith("_")}


def test_stub_matches_module():
    top, members = stub_names()
    assert public(top) == public(dir(extension))
    for name, stub_members in members.items():
        owner = extension
        for part in name.split("."):
            owner = getattr(owner, part)
        if issubclass(owner, __import__("enum").Enum):
            assert public(stub_members) == set(owner.__members__), name
        else:
            own = {n for n, _ in inspect.getmembers(owner) if not n.startswith("_")}
            assert public(stub_members) == own, name
