"""A copy of a GGUF model with some of its transformer blocks left out, for tests.

A draft model for speculative decoding must share the target's vocabulary; the cheapest one
at hand is the target itself with layers removed: smaller, faster and close enough to agree
with the target on many tokens. The blocks kept are renumbered from 0 and `<arch>.block_count`
is set to their number; every other key and tensor is copied as it is (quantized data
included), with the `gguf` package.
"""

from __future__ import annotations

import re

import gguf

_BLOCK = re.compile(r"^blk\.(\d+)\.(.*)$")
_HEADER_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


def write_truncated(src: str, dst: str, keep_layers: list[int]) -> None:
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    renumber = {old: new for new, old in enumerate(sorted(keep_layers))}
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name in _HEADER_KEYS or name == "general.architecture":
            continue
        value = len(renumber) if name == f"{arch}.block_count" else field.contents()
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
    for tensor in reader.tensors:
        name = tensor.name
        match = _BLOCK.match(name)
        if match is not None:
            layer = int(match.group(1))
            if layer not in renumber:
                continue
            name = f"blk.{renumber[layer]}.{match.group(2)}"
        # The reader's data is already in the writer's form: numpy order, quantized rows as bytes.
        writer.add_tensor(name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
