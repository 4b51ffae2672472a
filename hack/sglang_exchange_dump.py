"""SGLang's disaggregation bootstrap exchange, read from a release's source (never imported).

What a prefill rank registers at the bootstrap server and a decode asks it (HTTP, in
``sglang/srt/disaggregation/common/conn.py``), and what a decode sends a prefill rank over ZMQ
and how completion comes back (``sglang/srt/disaggregation/nixl/conn.py``): routes, JSON keys,
query keys, frame layouts. ``hack/engine_parser_dump.py`` puts it in the SGLang fixture as
``bootstrap_exchange``; tests/unit/test_refengine_sglang_bootstrap.py pins the reference
engine's fields to it.

Reading the syntax tree rather than importing keeps it runnable on an unpacked wheel:

    python3 hack/sglang_exchange_dump.py DIR   # DIR holds sglang/ (site-packages, or a wheel
                                               # unzipped); prints the JSON
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

COMMON = "sglang/srt/disaggregation/common/conn.py"
NIXL = "sglang/srt/disaggregation/nixl/conn.py"
BASE = "sglang/srt/disaggregation/base/conn.py"


def bootstrap_exchange(root: Path) -> dict[str, Any]:
    common, nixl, base = (ast.parse((root / path).read_text()) for path in (COMMON, NIXL, BASE))
    return {
        "sources": [COMMON, NIXL, BASE],
        **http_side(common),
        "zmq": zmq_side(common, nixl),
        "kv_poll": class_constants(_class(base, "KVPoll")),
        "nixl_notifications": nixl_notifications(nixl),
    }


# -- HTTP: CommonKVBootstrapServer and the managers that call it


def http_side(tree: ast.Module) -> dict[str, Any]:
    register = _function(tree, "register_to_bootstrap", "_register_to_bootstrap")
    put, get = _function(tree, "_handle_route_put"), _function(tree, "_handle_route_get")
    required, optional = _keys_read(put, "data")
    return {
        "routes": routes(_function(tree, "_setup_routes")),
        "rank_registration": _payload(register),
        "route_put_requires": required,
        "route_put_accepts": optional,
        "route_query": _query_keys(get),
        "decode_route_query": _url_query(_function(tree, "_get_bootstrap_info_from_server")),
        "server_info": _server_info(tree, get),
        "rank_info": _rank_info(tree, put),
    }


def routes(setup: ast.FunctionDef) -> list[list[str]]:
    """``add_route(METHOD, PATH, ...)``, ``add_get(PATH, ...)`` and the like, in order."""
    found = []
    for call in _calls(setup):
        name = getattr(call.func, "attr", "")
        args = [a.value for a in call.args if isinstance(a, ast.Constant)]
        if name == "add_route":
            found.append([str(args[0]), str(args[1])])
        elif name.startswith("add_"):
            found.append([name[len("add_") :].upper(), str(args[0])])
    return found


def _payload(func: ast.FunctionDef) -> dict[str, Any]:
    """The JSON a prefill rank PUTs: the ``payload`` dict and its later ``payload[KEY] =``."""
    keys: list[str] = []
    constants: dict[str, Any] = {}
    for node in _in_order(func, ast.Assign):
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "payload":
            assert isinstance(node.value, ast.Dict), "payload is not a dict literal"
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(key, ast.Constant)
                keys.append(key.value)
                if isinstance(value, ast.Constant):
                    constants[key.value] = value.value
        elif _subscript_of(target, "payload") is not None:
            keys.append(str(_subscript_of(target, "payload")))
    return {"keys": sorted(keys), "constants": constants}


def _keys_read(func: ast.FunctionDef, name: str) -> tuple[list[str], list[str]]:
    """Keys read as ``name[KEY]`` (required) and ``name.get(KEY)`` (optional)."""
    required = {_subscript_of(n, name) for n in ast.walk(func)} - {None}
    optional = {
        call.args[0].value
        for call in _calls(func)
        if _is_method_of(call, name, "get") and isinstance(call.args[0], ast.Constant)
    }
    return sorted(map(str, required)), sorted(optional)


def _query_keys(func: ast.FunctionDef) -> list[str]:
    """``request.query.get(KEY)``, in source order."""
    return [
        str(call.args[0].value)  # type: ignore[attr-defined]
        for call in _calls(func)
        if isinstance(call.func, ast.Attribute)
        and call.func.attr == "get"
        and getattr(call.func.value, "attr", "") == "query"
    ]


def _url_query(func: ast.FunctionDef) -> list[str]:
    """The query keys of the f-string URL the decode GETs, in order."""
    text = "".join(
        str(part.value)
        for node in ast.walk(func)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
        if isinstance(part, ast.Constant)
    )
    return re.findall(r"[?&](\w+)=", text)


def _server_info(tree: ast.Module, get: ast.FunctionDef) -> dict[str, list[str]]:
    """The answer to the all ``-1`` query: a dict literal (0.5.4) or a dataclass's fields
    (0.5.23: ``PrefillServerInfo``), less those popped when None."""
    omitted = sorted(
        str(call.args[0].value)  # type: ignore[attr-defined]
        for call in _calls(get)
        if getattr(call.func, "attr", "") == "pop"
    )
    literal = _dict_literal(get)
    if literal is not None:
        return {"keys": sorted(_dict_keys(literal)), "omitted_when_none": omitted}
    return {"keys": sorted(_built_fields(tree, get)), "omitted_when_none": omitted}


def _rank_info(tree: ast.Module, put: ast.FunctionDef) -> list[str]:
    """What the server stores for a rank, and answers a decode with."""
    literal = _dict_literal(put)
    return sorted(_dict_keys(literal) if literal is not None else _built_fields(tree, put))


def _built_fields(tree: ast.Module, func: ast.FunctionDef) -> list[str]:
    """The fields of the module's dataclass that ``func`` builds."""
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    built = [c.func.id for c in _calls(func) if getattr(c.func, "id", "") in classes]
    assert len(set(built)) == 1, f"{func.name} builds {built}, not one dataclass"
    body = classes[built[0]].body
    return [n.target.id for n in body if isinstance(n, ast.AnnAssign)]  # type: ignore[union-attr]


# -- ZMQ: NixlKVReceiver -> the prefill rank's bootstrap thread, and the status back


def zmq_side(common: ast.Module, nixl: ast.Module) -> dict[str, Any]:
    guard = _module_bytes(nixl, "GUARD")
    return {
        "guard": guard,
        "kv_args_room": _room_marker(_function(nixl, "_start_bootstrap_thread")),
        "kv_args": frame_layout(_function(_class(nixl, "KVArgsRegisterInfo"), "from_zmq")),
        "room": frame_layout(_function(_class(nixl, "TransferInfo"), "from_zmq")),
        "sent_frames": _sent_frames(nixl),
        "status": _status(common, nixl),
    }


def frame_layout(from_zmq: ast.FunctionDef) -> list[str]:
    """The field each frame fills, by index (after the guard): the ``cls(...)`` keywords,
    each traced to the one ``msg[i]`` it reads, directly or through local names."""
    assigns = _first_assignments(from_zmq)
    call = next(c for c in _calls(from_zmq) if getattr(c.func, "id", "") == "cls")
    by_index: dict[int, str] = {}
    for keyword in call.keywords:
        indices = _frame_indices(keyword.value, assigns, set())
        if indices:
            assert len(indices) == 1, f"{keyword.arg} reads frames {sorted(indices)}"
            by_index[indices.pop()] = str(keyword.arg)
    assert sorted(by_index) == list(range(len(by_index))), f"frames skipped: {by_index}"
    return [by_index[i] for i in range(len(by_index))]


def _frame_indices(expr: ast.expr, assigns: dict[str, ast.expr], seen: set[str]) -> set[int]:
    direct = {
        node.slice.value
        for node in ast.walk(expr)
        if isinstance(node, ast.Subscript)
        and getattr(node.value, "id", "") == "msg"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    }
    if direct:
        return direct
    found: set[int] = set()
    for name in (n.id for n in ast.walk(expr) if isinstance(n, ast.Name)):
        if name in assigns and name not in seen:
            found |= _frame_indices(assigns[name], assigns, seen | {name})
    return found


def _room_marker(thread: ast.FunctionDef) -> str:
    """The room a decode sends its one-off KV registration under (``room == "None"``)."""
    for node in ast.walk(thread):
        if isinstance(node, ast.Compare) and getattr(node.left, "id", "") == "room":
            right = node.comparators[0]
            if isinstance(right, ast.Constant) and isinstance(right.value, str):
                return right.value
    raise AssertionError("no room marker compared in the bootstrap thread")


def _sent_frames(nixl: ast.Module) -> dict[str, int]:
    """How many frames (guard included) the decode's list literals send: the registration's
    second frame is the room marker, a room's is the room."""
    counts: dict[str, int] = {}
    for node in ast.walk(nixl):
        if isinstance(node, ast.List) and node.elts and getattr(node.elts[0], "id", "") == "GUARD":
            second = node.elts[1]
            marker = isinstance(second, ast.Call) and isinstance(
                getattr(second.func, "value", None), ast.Constant
            )
            counts["kv_args" if marker else "room"] = len(node.elts)
    return counts


def _status(common: ast.Module, nixl: ast.Module) -> dict[str, Any] | None:
    """The prefill's status message to a decode rank (0.5.23: tagged, with a reason)."""
    parse = _function(common, "parse_kv_status_message", missing_ok=True)
    if parse is None:
        return None
    assigns = _first_assignments(parse)
    frames = {
        next(iter(indices)): name
        for name, value in assigns.items()
        if len(indices := _frame_indices(value, {}, set())) == 1
    }
    manager = class_constants(_class(nixl, "NixlKVManager"))
    return {
        "tag": manager.get("kv_status_msg_tag"),
        "carries_reason": manager.get("kv_status_msg_carries_reason"),
        "frames": [frames[i] for i in sorted(frames)],
    }


def nixl_notifications(nixl: ast.Module) -> dict[str, Any] | None:
    """0.5.4: the prefill's NIXL notifications (``ROOM_kv_CHUNK_LAST``, ``ROOM_aux``), as
    the decode's ``update_transfer_status`` splits them; None where it has none."""
    update = _function(nixl, "update_transfer_status", missing_ok=True)
    if update is None:
        return None
    separator = next(
        str(c.args[0].value)  # type: ignore[attr-defined]
        for c in _calls(update)
        if getattr(c.func, "attr", "") == "split"
    )
    kinds = sorted(
        str(node.comparators[0].value)  # type: ignore[attr-defined]
        for node in ast.walk(update)
        if isinstance(node, ast.Compare) and _subscript_of(node.left, "components") == 1
    )
    return {"separator": separator, "kinds": kinds}


# -- syntax-tree helpers


def _function(
    tree: ast.AST, *names: str, missing_ok: bool = False
) -> Any:  # ast.FunctionDef, or None with missing_ok
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            return node
    if missing_ok:
        return None
    raise AssertionError(f"no function {' or '.join(names)}")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def class_constants(cls: ast.ClassDef) -> dict[str, Any]:
    """``NAME = constant`` in a class body (bytes as text)."""
    found = {}
    for node in cls.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            value = node.value.value
            found[getattr(target, "id", "")] = value.decode() if isinstance(value, bytes) else value
    return found


def _module_bytes(tree: ast.Module, name: str) -> str:
    """``NAME = "text".encode(...)`` at module level."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            call = node.value
            assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            assert isinstance(call.func.value, ast.Constant)
            return str(call.func.value.value)
    raise AssertionError(f"no module constant {name}")


def _calls(tree: ast.AST) -> list[ast.Call]:
    return _in_order(tree, ast.Call)


def _in_order(tree: ast.AST, kind: type[Any]) -> list[Any]:
    nodes = [n for n in ast.walk(tree) if isinstance(n, kind)]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _first_assignments(func: ast.FunctionDef) -> dict[str, ast.expr]:
    """Each local name's first assignment in source order."""
    found: dict[str, ast.expr] = {}
    for node in _in_order(func, ast.Assign):
        target = node.targets[0]
        if isinstance(target, ast.Name):
            found.setdefault(target.id, node.value)
    return found


def _subscript_of(node: ast.AST, name: str) -> Any:
    """KEY where ``node`` is ``name[KEY]`` with a constant KEY, else None."""
    if (
        isinstance(node, ast.Subscript)
        and getattr(node.value, "id", "") == name
        and isinstance(node.slice, ast.Constant)
    ):
        return node.slice.value
    return None


def _is_method_of(call: ast.Call, name: str, method: str) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == method
        and (getattr(func.value, "id", "") == name)
    )


def _dict_literal(func: ast.FunctionDef) -> ast.Dict | None:
    """The function's first dict literal with keys (``{}`` defaults are not answers)."""
    return next((n for n in _in_order(func, ast.Dict) if n.keys), None)


def _dict_keys(literal: ast.Dict) -> list[str]:
    return [str(k.value) for k in literal.keys if isinstance(k, ast.Constant)]


if __name__ == "__main__":
    json.dump(bootstrap_exchange(Path(sys.argv[1])), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
