"""The ``gguf`` weight format's matrices: the blocks of the GGUF file a converted model was made from.

A model named by a GGUF (``--model qwen2.5-coder-1.5b-instruct``, ``path/to/file.gguf``) is converted once into a
float32 folder (``gguf_cache``): exactly the file's dequantized values. The ``gguf`` format multiplies the file's
own quantized blocks instead (Q4_K, Q6_K, Q4_1, Q8_0: ``blockq``), so a step reads the file's 4.5-8.5 bits per
weight, not 32, and the values are the same ones: nothing is quantized a second time.

:func:`source_file` finds the file (a package's own, or the one assembled from part packages beside the converted
weights; assembled again once where an older conversion deleted it); :func:`read_matrices` reads the matrices the lean forward
needs, as ``(ggml type, rows of raw blocks, (out, in))`` under the names below, with llama's query and key rows put
back in ``transformers``' order (``convert_hf_to_gguf`` interleaves them for llama.cpp's rotary layout)::

    read_matrices(path, n_layers=30, n_heads=9, n_kv=3)
    # {"0.q": Blocks("Q4_1", uint8 [576, 360], (576, 576)), "0.k": ..., "0.v": ..., "0.o": ..., "0.gate": ...,
    #  "0.up": ..., "0.down": ..., ..., "embed": Blocks("Q8_0", ...)}   (no "head": the head is the embedding)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# a layer's matrices: our name -> the GGUF's (blk.<i>.<name>.weight)
LAYER_TENSORS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
                 "up": "ffn_up", "down": "ffn_down"}
PERMUTED_ARCHS = ("llama",)  # architectures whose q/k rows convert_hf_to_gguf interleaves


@dataclass
class Blocks:
    """One matrix as the file keeps it: ``raw`` [out, bytes per row] (a view of the file's mapping, or a copy
    where rows were reordered), ``shape`` (out, in) as ``nn.Linear`` has it."""

    ggml_type: str
    raw: np.ndarray
    shape: tuple[int, int]
    path: Path | None = None  # the file and where its bytes begin (rows in the file's order only: FileRows)
    offset: int = 0


class FileRows:
    """An embedding table read where the file keeps it (a memory mapping of its bytes alone): a lookup
    dequantizes the rows it reads (exactly, as gguf-py does), and only the pages of rows looked up become
    resident, where a copy would hold the whole table (Qwen2.5-Coder-1.5B's Q4_K table: 131 MB). For a model
    whose LM head is another matrix (a tied table is the head's, multiplied at every step: kept in memory).
    Example: ``FileRows(read_matrices(path, ...)["embed"]).rows(torch.tensor([5, 9]))`` -> [2, hidden]."""

    def __init__(self, blocks: Blocks) -> None:
        if blocks.path is None:
            raise ValueError("FileRows needs a table read from a file (Blocks.path)")
        n, row_bytes = blocks.raw.shape
        self.ggml_type, self.shape = blocks.ggml_type, blocks.shape
        self._raw = np.memmap(blocks.path, dtype=np.uint8, mode="r", offset=blocks.offset, shape=(n, row_bytes))

    def rows(self, ids: Any) -> Any:
        """The dequantized rows ``ids`` (an integer tensor [T]) -> float32 [T, hidden]."""
        import torch
        from gguf import GGMLQuantizationType, quants

        idx = ids.reshape(-1).cpu().numpy()
        out = quants.dequantize(np.asarray(self._raw[idx]), GGMLQuantizationType[self.ggml_type])
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(*ids.shape, self.shape[1])


def source_file(folder: str | Path) -> Path:
    """The GGUF file the converted ``folder`` was made from. A package's file is read where it is (its size
    checked against the conversion's record); one assembled from part packages is kept in ``folder`` by the
    conversion (an older conversion deleted it: then it is assembled there again, once, its sha256 checked).
    ValueError, saying what to do, where the folder is not a conversion or the file is gone or changed."""
    from suffixspec.gguf_cache import assemble_gguf, file_lock, read_record
    from suffixspec.models import KNOWN_MODELS, known_source

    folder = Path(folder)
    record = read_record(folder)
    if record is None or not record.get("gguf"):
        raise ValueError(f"{folder} is not a model converted from a GGUF file; weights='gguf' needs a model named "
                         f"by its GGUF (a known name or a .gguf path)")
    named = Path(record["gguf"])
    if named.is_absolute():
        if not named.is_file():
            raise ValueError(f"the GGUF {named} that {folder.name} was converted from is gone; reinstall it, or use "
                             f"weights='int8' or 'float32'")
        if "size" in record and named.stat().st_size != record["size"]:
            raise ValueError(f"the GGUF {named} changed since {folder.name} was converted; load the model again "
                             f"(it converts anew) or use weights='int8'")
        return named
    local = folder / named.name
    known = KNOWN_MODELS.get(record.get("name", ""))
    if known is None or known.parts is None and not known.assembled:
        raise ValueError(f"cannot find the GGUF {named.name} of {folder}; use weights='int8' or 'float32'")
    with file_lock(folder / ".gguf.lock"):
        if not local.is_file():
            log.info("assembling %s again from its packages into %s for weights='gguf' (once)", named.name, folder)
            tmp = local.with_name(f".{local.name}.tmp")
            assemble_gguf(known_source(known), tmp)
            tmp.replace(local)
    return local


def read_matrices(path: str | Path, n_layers: int, n_heads: int, n_kv: int) -> dict[str, Blocks]:
    """Every layer's matrices (``"<i>.q"`` ... ``"<i>.down"``, :data:`LAYER_TENSORS`), ``"embed"`` and, where the
    file has its own output matrix, ``"head"``; views of the file's memory mapping (pages read as used)."""
    arch, tensors, data = directory(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, Blocks] = {}
    wanted = {f"{i}.{ours}": f"blk.{i}.{theirs}.weight" for i in range(n_layers) for ours, theirs in LAYER_TENSORS.items()}
    wanted.update(embed="token_embd.weight", head="output.weight")
    for ours, theirs in wanted.items():
        t = tensors.get(theirs)
        if t is None:
            if ours == "head":
                continue
            raise ValueError(f"{path}: no tensor {theirs} (is it a {n_layers}-layer model of this architecture?)")
        k, n = (t.dims[0], t.dims[1]) if len(t.dims) >= 2 else (t.dims[0], 1)
        start = data + t.offset
        raw = mapped[start:start + t.nbytes].reshape(n, -1)
        if arch in PERMUTED_ARCHS and ours.endswith((".q", ".k")):
            raw = raw[_unpermute(n, n_heads if ours.endswith(".q") else n_kv)]
        out[ours] = Blocks(t.ggml_type, raw, (n, k), Path(path), start)
    return out


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file's directory: its type's name, dims (GGUF order: the row length first), its
    offset in the data section and its size in bytes."""

    ggml_type: str
    dims: tuple[int, ...]
    offset: int
    nbytes: int


# GGUF metadata value types with a fixed size (bytes): uint8 .. float32, bool, uint64, int64, float64
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def directory(path: str | Path) -> tuple[str | None, dict[str, TensorInfo], int]:
    """(architecture, tensors by name, where the data section starts) of a GGUF file, read from its header alone:
    the metadata values are skipped, not decoded (``gguf.GGUFReader`` builds an array per token of the
    vocabulary: 3.7 of SmolLM2's start-up seconds). ValueError for a file that is not a GGUF of version 2-3."""
    import mmap
    import os
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 4:
            raise ValueError(f"{path} is not a GGUF file (it holds {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:  # only the header's pages are read
            pos = 0
            unpack_u64 = struct.Struct("<Q").unpack_from

            def need(n: int) -> None:
                if pos + n > len(buf):
                    raise ValueError(f"{path}: the GGUF header ends early (a truncated file?)")

            def u32() -> int:
                nonlocal pos
                need(4)
                pos += 4
                return struct.unpack_from("<I", buf, pos - 4)[0]

            def u64() -> int:
                nonlocal pos
                need(8)
                pos += 8
                return unpack_u64(buf, pos - 8)[0]

            def string() -> bytes:
                nonlocal pos
                n = u64()
                need(n)
                pos += n
                return bytes(buf[pos - n:pos])

            def skip(vtype: int) -> None:
                nonlocal pos
                if vtype in _FIXED:
                    need(_FIXED[vtype])
                    pos += _FIXED[vtype]
                elif vtype == _STRING:
                    n = u64()
                    need(n)
                    pos += n
                elif vtype == _ARRAY:
                    item, count = u32(), u64()
                    if item in _FIXED:
                        need(count * _FIXED[item])
                        pos += count * _FIXED[item]
                    elif item == _STRING:  # a vocabulary's tokens or merges: each a length, then its bytes
                        end = len(buf)
                        for _ in range(count):
                            if pos + 8 > end:
                                need(8)
                            pos += 8 + unpack_u64(buf, pos)[0]
                        need(0)
                    else:
                        for _ in range(count):
                            skip(item)
                else:
                    raise ValueError(f"{path}: unknown GGUF metadata type {vtype}")

            need(4)
            if buf[:4] != b"GGUF":
                raise ValueError(f"{path} is not a GGUF file (it starts {bytes(buf[:4])!r})")
            pos = 4
            version = u32()
            if version not in (2, 3):
                raise ValueError(f"{path}: GGUF version {version}; this reader knows versions 2 and 3")
            n_tensors, n_kv = u64(), u64()
            arch, alignment = None, 32
            for _ in range(n_kv):
                key, vtype = string(), u32()
                if key == b"general.architecture" and vtype == _STRING:
                    arch = string().decode()
                elif key == b"general.alignment" and vtype == 4:
                    alignment = u32()
                else:
                    skip(vtype)
            tensors: dict[str, TensorInfo] = {}
            for _ in range(n_tensors):
                name = string().decode()
                dims = tuple(u64() for _ in range(u32()))
                kind, offset = GGMLQuantizationType(u32()), u64()
                block, size = GGML_QUANT_SIZES[kind]
                count = int(np.prod(dims, dtype=np.int64))
                tensors[name] = TensorInfo(kind.name, dims, offset, count // block * size)
            data = (pos + alignment - 1) // alignment * alignment
    return arch, tensors, data


def _unpermute(rows: int, heads: int) -> np.ndarray:
    """The file's row of each ``transformers`` row of a llama q or k matrix: convert_hf_to_gguf wrote, per head,
    the rotary halves interleaved (row 2j is the first half's j-th, 2j + 1 the second half's)."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(1, 2).reshape(rows)
