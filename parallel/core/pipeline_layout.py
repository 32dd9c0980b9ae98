"""Megatron-core's pipeline layout string (--pipeline-model-parallel-layout) -> the plan's stage split.

The grammar and checks are megatron/core/transformer/pipeline_parallel_layer_layout.py's
(PipelineParallelLayerLayout.parse_str_to_list and validate_layer_layout):

* characters: E the embedding, t a transformer (decoder) layer, m a multi-token-prediction layer,
  L the loss; `|` ends a virtual stage; commas are cosmetic and dropped;
* repetition: `(...)*N` repeats the bracketed text N times (no nesting), then `x*N` repeats the one
  character before it: "Et|(tt|)*30mL" is "Et|" + "tt|" x 30 + "mL", 32 virtual stages;
* the stages, in model order, number pp x vpp: virtual stage i lives on pipeline rank i mod pp, as
  its chunk i // pp (Megatron-core's interleaved assignment), so rank r holds stages r, r + pp, ...;
* E comes first and L last, each exactly once; the t's are the model's layers; m's follow every t,
  all in one virtual stage, the last of its rank's (and, given the model's MTP layers, that many).
  A virtual stage may hold any number of layers, none included: Megatron-core checks no divisibility.

A plan with a layout (Plan.pp_layout) holds it as the truth; `plan_split` gives its summary in the
plan's other fields (vpp, first_stage_layers, last_stage_layers; the embedding and loss never
"in the split": the layout places them): the plan splits a pipeline into its first rank, equal
middle ranks and its last rank. A layout whose middle ranks differ is refused (LayoutError names
them); one whose rank holds unequal virtual stages, or MTP layers, maps with a note saying what the
plan model does with them.

Pure: stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from parallel.core.specs import SpecError

LAYER_CHARS = {"E": "embedding", "t": "transformer layer", "m": "MTP layer", "L": "loss"}
MAX_LAYOUT_CHARS = 1 << 16  # the unrolled layout: far past any model's layers, bounded before it is built
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")  # Megatron-core's two unrolling patterns, applied in turn
_CHAR = re.compile(r"(.)\*(\d+)")


class LayoutError(SpecError):
    """A pipeline layout string that Megatron-core would refuse, or the plan cannot express."""


@dataclass(frozen=True)
class PipelineLayout:
    """A parsed layout: its virtual stages in model order (unrolled, e.g. 'Et'), over pp ranks."""

    text: str
    pp: int
    stages: tuple[str, ...]

    @property
    def vpp(self) -> int:
        return len(self.stages) // self.pp

    def rank_stages(self, rank: int) -> tuple[str, ...]:
        """The virtual stages pipeline rank `rank` holds, chunk 0 first: stages rank, rank + pp, ..."""
        return self.stages[rank :: self.pp]

    def rank_layers(self) -> tuple[int, ...]:
        """Transformer layers on each pipeline rank (all its virtual stages)."""
        return tuple(sum(s.count("t") for s in self.rank_stages(r)) for r in range(self.pp))

    @property
    def layers(self) -> int:
        return sum(s.count("t") for s in self.stages)

    @property
    def mtp_layers(self) -> int:
        return sum(s.count("m") for s in self.stages)

    def chunk_layers(self, rank: int) -> tuple[int, ...]:
        """Transformer layers in each virtual stage of pipeline rank `rank`, chunk 0 first."""
        return tuple(s.count("t") for s in self.rank_stages(rank))


def unroll(text: str) -> str:
    """The layout with its cosmetic commas dropped and its repetitions written out (parse_str_to_list's
    two patterns, in its order). LayoutError where the result would pass MAX_LAYOUT_CHARS."""
    total = [len(text)]

    def repeat(match: re.Match) -> str:
        body, digits = match.group(1), match.group(2)
        if len(digits) > 6 or len(body) * int(digits) > MAX_LAYOUT_CHARS:
            raise LayoutError(
                f"pipeline layout {text!r}: {match.group(0)!r} unrolls past {MAX_LAYOUT_CHARS:,} characters"
            )
        total[0] += len(body) * (int(digits) - 1)
        if total[0] > MAX_LAYOUT_CHARS:
            raise LayoutError(f"pipeline layout {text!r} unrolls past {MAX_LAYOUT_CHARS:,} characters")
        return body * int(digits)

    out = text.replace(",", "")
    for pattern in (_GROUP, _CHAR):
        out = pattern.sub(repeat, out)
    return out


def parse_layout(text: str, pp: int, layers: int | None = None, mtp_layers: int | None = None) -> PipelineLayout:
    """The layout `text` over `pp` pipeline ranks, checked as Megatron-core checks it: known characters,
    a stage count divisible by pp, E first and L last once each, MTP layers after every transformer
    layer and all in one virtual stage, the last of its rank's; given `layers` (`mtp_layers`), that
    many t's (m's). LayoutError naming the first problem."""
    if len(text) > MAX_LAYOUT_CHARS:
        raise LayoutError(f"pipeline layout of {len(text):,} characters; at most {MAX_LAYOUT_CHARS:,}")
    stages = tuple(unroll(text).split("|"))
    for stage in stages:
        bad = sorted({c for c in stage if c not in LAYER_CHARS})
        if bad:
            raise LayoutError(
                f"pipeline layout {text!r}: unknown character(s) {', '.join(map(repr, bad))} in stage {stage!r}; "
                f"known: " + ", ".join(f"{c} ({what})" for c, what in LAYER_CHARS.items()) + ", | (stage end)"
            )
    if len(stages) % pp:
        raise LayoutError(
            f"pipeline layout {text!r} has {len(stages)} virtual stages, not a multiple of pp = {pp} "
            f"(the stages number pp x vpp)"
        )
    flat = "".join(stages)
    for char, where, index in (("E", "first", 0), ("L", "last", -1)):
        if not flat or flat[index] != char or flat.count(char) != 1:
            raise LayoutError(
                f"pipeline layout {text!r}: the {LAYER_CHARS[char]} ({char}) must come {where}, once "
                f"(found {flat.count(char)})"
            )
    if "m" in flat and "t" in flat[flat.index("m") :]:
        raise LayoutError(f"pipeline layout {text!r}: transformer layers (t) must all come before MTP layers (m)")
    layout = PipelineLayout(text, pp, stages)
    with_mtp = [i for i, stage in enumerate(stages) if "m" in stage]
    if len(with_mtp) > 1:
        raise LayoutError(
            f"pipeline layout {text!r}: MTP layers (m) in virtual stages {', '.join(map(str, with_mtp))}; "
            f"Megatron-core needs them all in one"
        )
    if with_mtp and with_mtp[0] // pp != layout.vpp - 1:
        raise LayoutError(
            f"pipeline layout {text!r}: the MTP layers (m) are in virtual stage {with_mtp[0]}, chunk "
            f"{with_mtp[0] // pp} of rank {with_mtp[0] % pp}; Megatron-core needs them in a rank's last "
            f"chunk ({layout.vpp - 1})"
        )
    if layers is not None and layout.layers != layers:
        raise LayoutError(f"pipeline layout {text!r} holds {layout.layers} transformer layers (t), the model {layers}")
    if mtp_layers is not None and layout.mtp_layers != mtp_layers:
        raise LayoutError(f"pipeline layout {text!r} holds {layout.mtp_layers} MTP layers (m), the model {mtp_layers}")
    return layout


def plan_split(layout: PipelineLayout) -> tuple[dict, list[str]]:
    """(the plan fields the layout sets: vpp, first_stage_layers, last_stage_layers, embedding_in_split,
    loss_in_split; notes). The first and last rank's layers are given where they differ from the
    middle ranks' (at pp 2, where either rank differs, both). LayoutError where the middle ranks
    differ from one another."""
    ranks = layout.rank_layers()
    pp = layout.pp
    notes = []
    fields: dict = {
        "vpp": layout.vpp,
        "first_stage_layers": None,
        "last_stage_layers": None,
        "embedding_in_split": False,
        "loss_in_split": False,
    }
    middle = set(ranks[1:-1])
    if len(middle) > 1:
        raise LayoutError(
            f"pipeline layout {layout.text!r}: the middle ranks 1-{pp - 2} hold "
            f"{', '.join(map(str, ranks[1:-1]))} transformer layers; the plan splits only its first and "
            f"last rank apart from equal middle ranks"
        )
    if pp > 1:
        even = middle.pop() if middle else None
        if even is None and ranks[0] != ranks[-1]:  # pp 2: no middle rank to compare with
            fields.update(first_stage_layers=ranks[0], last_stage_layers=ranks[-1])
        elif even is not None:
            fields["first_stage_layers"] = ranks[0] if ranks[0] != even else None
            fields["last_stage_layers"] = ranks[-1] if ranks[-1] != even else None
    for r in range(pp):
        counts = [s.count("t") for s in layout.rank_stages(r)]
        if len(set(counts)) > 1:
            notes.append(
                f"pipeline layout: rank {r}'s virtual stages hold {', '.join(map(str, counts))} layers: activation "
                f"memory counts each, the pipeline bubble their mean"
            )
    if layout.mtp_layers:
        rank = next(r for r in range(pp) if any("m" in s for s in layout.rank_stages(r)))
        notes.append(f"pipeline layout: {layout.mtp_layers} MTP layer(s) on rank {rank}, not modelled")
    return fields, notes
