"""The hand-kept proto subsets in protos/ must match Envoy's API on the wire.

Each declared message field (number, type, repetition, message/enum type) and enum
value is compared with xds-protos' generated descriptors of the upstream files. The two
cannot share a process (same symbol names), so the comparison runs in a subprocess.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

COMPARE = r"""
import json, sys
from ext_proc._pb import external_processor_pb2 as ours
def walk(message, out):
    if message.full_name in out:
        return
    fields = {}
    out[message.full_name] = fields
    for f in message.fields:
        ref = f.message_type or f.enum_type
        fields[f.name] = [f.number, f.type, f.is_repeated, ref.full_name if ref else ""]
        if f.message_type and not f.message_type.full_name.startswith("google.protobuf"):
            walk(f.message_type, out)
        if f.enum_type:
            out[f.enum_type.full_name] = {v.name: v.number for v in f.enum_type.values}
out = {}
for name in ("ProcessingRequest", "ProcessingResponse"):
    walk(ours.DESCRIPTOR.message_types_by_name[name], out)
service = ours.DESCRIPTOR.services_by_name["ExternalProcessor"]
out["rpc"] = [m.full_name for m in service.methods]
json.dump(out, sys.stdout)
"""

UPSTREAM = COMPARE.replace(
    "from ext_proc._pb import external_processor_pb2 as ours",
    "from envoy.service.ext_proc.v3 import external_processor_pb2 as ours",
)


def _dump(script: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_subset_matches_upstream_descriptors():
    ours = _dump(COMPARE)
    upstream = _dump(UPSTREAM)
    assert ours.pop("rpc") == upstream.pop("rpc")
    for name, entries in ours.items():
        assert name in upstream, f"{name} is not an upstream type"
        for key, value in entries.items():
            assert upstream[name].get(key) == value, (
                f"{name}.{key}: {value} != {upstream[name].get(key)}"
            )


def test_message_classes_are_upb_backed():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from google.protobuf.internal import api_implementation as a; print(a.Type())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "upb"
