"""RFC 6902 JSON Patch: each operation, pointer escaping, and errors that name the operation."""

from __future__ import annotations

from typing import Any

import pytest

from pdctl.sdk.jsonpatch import JsonPatchError, apply_patch, split_pointer


def test_pointer_escapes():
    assert split_pointer("") == []
    assert split_pointer("/a~1b/c~0d/0") == ["a/b", "c~d", "0"]
    with pytest.raises(JsonPatchError, match="must start with '/'"):
        split_pointer("spec/x")


def test_add_remove_replace_test_in_order_without_touching_the_input():
    doc: dict[str, Any] = {"spec": {"containers": [{"name": "vllm"}], "volumes": []}}
    out = apply_patch(
        doc,
        [
            ("test", "/spec/containers/0/name", "vllm"),
            ("add", "/spec/hostIPC", True),
            ("add", "/spec/containers/-", {"name": "sidecar"}),
            ("add", "/spec/containers/0", {"name": "first"}),
            ("replace", "/spec/containers/1/name", "engine"),
            ("remove", "/spec/volumes", None),
            ("add", "/metadata", {"annotations": {"a/b": "1"}}),
            ("replace", "/metadata/annotations/a~1b", "2"),
        ],
    )
    assert out == {
        "spec": {
            "containers": [{"name": "first"}, {"name": "engine"}, {"name": "sidecar"}],
            "hostIPC": True,
        },
        "metadata": {"annotations": {"a/b": "2"}},
    }
    assert doc == {"spec": {"containers": [{"name": "vllm"}], "volumes": []}}


def test_values_are_copied_not_shared():
    value = {"k": [1]}
    out = apply_patch({}, [("add", "/x", value), ("add", "/y", value)])
    out["x"]["k"].append(2)
    assert out["y"] == {"k": [1]}
    assert value == {"k": [1]}


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([("remove", "/spec/nope", None)], r"operation \[0\]: remove /spec/nope: 'nope' does not"),
        ([("replace", "/spec/a/b", 1)], r"'a' does not exist"),
        ([("add", "/spec/list/5", 1)], r"index 5 is past the end \(length 1\)"),
        ([("remove", "/spec/list/-", None)], r"'-' is not an array index"),
        ([("add", "/spec/list/01", 1)], r"'01' is not an array index"),
        ([("add", "/spec/x", 1), ("test", "/spec/x", 2)], r"operation \[1\]: test /spec/x: 1 is"),
        ([("add", "/spec/s/x", 1)], r"not an object or array"),
        ([("remove", "", None)], r"whole document"),
    ],
)
def test_errors_name_the_operation_and_path(ops: Any, message: str):
    with pytest.raises(JsonPatchError, match=message):
        apply_patch({"spec": {"list": [0], "s": "text"}}, ops)


def test_whole_document_replace_and_test():
    assert apply_patch({"a": 1}, [("test", "", {"a": 1}), ("replace", "", [1])]) == [1]
    with pytest.raises(JsonPatchError, match="differs"):
        apply_patch({"a": 1}, [("test", "", {})])
