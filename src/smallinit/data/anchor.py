"""The anchor-function composition task (Zhang et al. 2024): does a model compose, or memorise?

Each anchor token ``Ak`` stands for a function "add offset δ_k". A question is a row of numbers in which a
key number x is followed by two anchors a, b; the answer is the composition x + δ_a + δ_b::

    17 3 40 A1 A3 88 9 61 = 43          (x = 40, δ_1 = 5, δ_3 = −2)

Some ordered anchor pairs are held out: they never occur in training. For each held-out pair (a, b) its
mirror (b, a) is trained with a *non-compositional* answer x + δ_a + δ_b + twist. On the held-out pair a
model that learned the single-anchor functions and composes them answers x + δ_a + δ_b (the "reasoning"
or inferential answer); one that copies the trained mirror answers x + δ_a + δ_b + twist (the
"memorising" or symmetric answer). With 4 anchors of offsets 5, 1, −2, −8 and twist 4 this is the
setting of Zhang et al. (mirror (3, 4) trained as x − 6, so on (4, 3) reasoning says x − 10 and memorising
says x − 6).

Parameters come from the corpus spec's query string, e.g. ``builtin:anchor?anchors=4&holdout=1&seed=0``:

* ``anchors`` (4; 2–16) number of anchor tokens A1…A<anchors>
* ``offsets`` (``5,1,-2,-8`` for 4 anchors, else distinct non-zero integers in [−9, 9] drawn from ``seed``)
* ``holdout`` (1) number of held-out ordered pairs (a ≠ b), drawn from ``seed``; no two are mirrors
* ``twist`` (4; ≠ 0) how far a held-out pair's mirror is trained away from the composition
* ``numbers`` (100; ≤ 256) number tokens 0…numbers−1; keys are drawn so that every answer is one of them
* ``length`` (8; ≥ 3) tokens in a question: the key, the two anchors and ``length − 3`` distractor numbers
* ``n`` (20000) training documents
* ``label_noise`` (0; in [0, 1)) fraction of training answers replaced by a uniform random number
* ``seed`` (0) everything above that is drawn

Nothing is downloaded; the documents are a pure function of the parameters. Tokens are whole words, so
use the ``anchor`` tokenizer (``data.tokenizer = "anchor"``): every number, anchor and ``=`` is one token.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from smallinit.data.tokenizer import ANSWER_MARK, MAX_ANCHORS, MAX_NUMBERS, anchor_token
from smallinit.errors import DataError

PAPER_OFFSETS = (5, 1, -2, -8)
_FORMAT = 1  # bump when the document layout changes (it is part of the fingerprint)
_STREAM_TRAIN, _STREAM_PROBE = 1, 2  # independent random streams for training documents and probes


@dataclass(frozen=True)
class Question:
    """One probe: the question text (up to and including '='), the pair, and the candidate answers."""

    text: str
    key: int
    pair: tuple[int, int]
    answer: int  # the composition x + δ_a + δ_b ("reasoning" on a held-out pair)
    memorised: int | None  # the mirror's trained answer on a held-out pair, else None


@dataclass(frozen=True)
class AnchorTask:
    """The task's parameters; ``offsets`` and the held-out pairs are resolved from them in ``__post_init__``."""

    anchors: int = 4
    offsets: tuple[int, ...] = ()
    holdout: int = 1
    twist: int = 4
    numbers: int = 100
    length: int = 8
    n: int = 20000
    label_noise: float = 0.0
    seed: int = 0
    heldout: tuple[tuple[int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if not 2 <= self.anchors <= MAX_ANCHORS:
            raise DataError(f"anchor task: anchors={self.anchors} must be in 2..{MAX_ANCHORS}")
        rng = np.random.default_rng([self.seed, 0])
        offsets = tuple(self.offsets) or self._default_offsets(rng)
        if len(offsets) != self.anchors or 0 in offsets:
            raise DataError(
                f"anchor task: offsets={','.join(map(str, offsets))} must be {self.anchors} non-zero integers"
            )
        object.__setattr__(self, "offsets", tuple(int(o) for o in offsets))
        if self.twist == 0:
            raise DataError(
                "anchor task: twist must be non-zero, or memorising and reasoning answers coincide"
            )
        n_pairs = self.anchors * (self.anchors - 1) // 2  # at most one of each mirror couple is held out
        if not 1 <= self.holdout <= n_pairs:
            raise DataError(
                f"anchor task: holdout={self.holdout} must be in 1..{n_pairs} for {self.anchors} anchors"
            )
        if not 3 <= self.length <= 64:
            raise DataError(
                f"anchor task: length={self.length} must be in 3..64 (key, two anchors, distractors)"
            )
        if not 0 <= self.label_noise < 1:
            raise DataError(f"anchor task: label_noise={self.label_noise} must be in [0, 1)")
        if self.n < 1 or self.seed < 0:
            raise DataError(f"anchor task: n={self.n} must be ≥ 1 and seed={self.seed} ≥ 0")
        if not 2 <= self.numbers <= MAX_NUMBERS:
            raise DataError(f"anchor task: numbers={self.numbers} must be in 2..{MAX_NUMBERS}")
        candidates = [p for p in itertools.permutations(range(1, self.anchors + 1), 2)]
        heldout: list[tuple[int, int]] = []
        for i in rng.permutation(len(candidates)):
            a, b = candidates[i]
            if (b, a) not in heldout and len(heldout) < self.holdout:
                heldout.append((a, b))
        object.__setattr__(self, "heldout", tuple(sorted(heldout)))
        lo, hi = self.key_range
        if hi - lo < 2:
            raise DataError(
                f"anchor task: numbers={self.numbers} leaves no room for keys with offsets {self.offsets} and "
                f"twist {self.twist}; raise numbers"
            )

    def _default_offsets(self, rng: np.random.Generator) -> tuple[int, ...]:
        if self.anchors == len(PAPER_OFFSETS):
            return PAPER_OFFSETS
        pool = [v for v in range(-9, 10) if v]
        return tuple(int(v) for v in rng.choice(pool, size=self.anchors, replace=False))

    # -- the rules -------------------------------------------------------------------------------------

    @property
    def twisted(self) -> tuple[tuple[int, int], ...]:
        """The mirrors of the held-out pairs: trained with the twisted (non-compositional) answer."""
        return tuple((b, a) for a, b in self.heldout)

    @property
    def train_pairs(self) -> tuple[tuple[int, int], ...]:
        """Every ordered pair (self-pairs included) except the held-out ones."""
        pairs = itertools.product(range(1, self.anchors + 1), repeat=2)
        return tuple(p for p in pairs if p not in self.heldout)

    def shift(self, pair: tuple[int, int]) -> int:
        """What the pair adds to the key in training: the composition, plus ``twist`` for a mirror pair."""
        a, b = pair
        return self.offsets[a - 1] + self.offsets[b - 1] + (self.twist if pair in self.twisted else 0)

    @property
    def key_range(self) -> tuple[int, int]:
        """Keys x in [lo, hi): every answer, compositional or twisted, is a number token."""
        shifts = [
            self.offsets[a - 1] + self.offsets[b - 1]
            for a, b in itertools.product(range(1, self.anchors + 1), repeat=2)
        ]
        shifts += [self.shift(p) for p in self.twisted]
        return max(0, -min(shifts)), self.numbers - max(0, max(shifts))

    # -- documents ---------------------------------------------------------------------------------------

    def _question(self, rng: np.random.Generator, pair: tuple[int, int]) -> tuple[list[str], int]:
        lo, hi = self.key_range
        key = int(rng.integers(lo, hi))
        words = [str(int(v)) for v in rng.integers(0, self.numbers, size=self.length - 3)]
        at = int(rng.integers(0, self.length - 2))
        words[at:at] = [str(key), anchor_token(pair[0]), anchor_token(pair[1])]
        return words, key

    def documents(self) -> Iterator[str]:
        """The ``n`` training documents: questions over the training pairs with their trained answers."""
        rng = np.random.default_rng([self.seed, _STREAM_TRAIN])
        pairs = self.train_pairs
        for _ in range(self.n):
            pair = pairs[int(rng.integers(0, len(pairs)))]
            words, key = self._question(rng, pair)
            answer = key + self.shift(pair)
            if self.label_noise and rng.random() < self.label_noise:
                answer = int(rng.integers(0, self.numbers))
            yield " ".join([*words, ANSWER_MARK, str(answer)])

    def probes(self, kind: str, n: int, seed: int = 0) -> list[Question]:
        """``n`` fresh questions: ``"train"`` over the training pairs, ``"heldout"`` over the held-out pairs."""
        if kind not in ("train", "heldout"):
            raise DataError(f"anchor probe kind {kind!r} must be 'train' or 'heldout'")
        rng = np.random.default_rng([self.seed, _STREAM_PROBE, seed, kind == "heldout"])
        pairs = self.train_pairs if kind == "train" else self.heldout
        out = []
        for i in range(n):
            pair = pairs[i % len(pairs)]  # round robin: every pair equally often
            words, key = self._question(rng, pair)
            mirror = (pair[1], pair[0])
            memorised = key + self.shift(mirror) if kind == "heldout" else None
            text = " ".join([*words, ANSWER_MARK])
            out.append(Question(text, key, pair, key + self.shift(pair), memorised))
        return out

    # -- spec strings --------------------------------------------------------------------------------------

    @staticmethod
    def from_params(params: str = "") -> AnchorTask:
        """Parse ``"anchors=4&holdout=1"`` (a spec's query string; ``builtin:anchor?`` may lead)."""
        params = params.split("?", 1)[1] if "?" in params else params
        known = {f.name: f.type for f in fields(AnchorTask) if f.init}
        kwargs: dict = {}
        for key, values in urllib.parse.parse_qs(
            params, keep_blank_values=True, strict_parsing=False
        ).items():
            if key not in known:
                raise DataError(f"anchor task: unknown parameter {key!r}; known: {', '.join(known)}")
            value = values[-1]
            try:
                if key == "offsets":
                    kwargs[key] = tuple(int(v) for v in value.split(",") if v.strip())
                elif key == "label_noise":
                    kwargs[key] = float(value)
                else:
                    kwargs[key] = int(value)
            except ValueError:
                raise DataError(f"anchor task: {key}={value!r} is not a number") from None
        return AnchorTask(**kwargs)

    def params(self) -> str:
        """The canonical query string (every parameter, offsets resolved)."""
        d = {k: v for k, v in asdict(self).items() if k != "heldout"}
        d["offsets"] = ",".join(map(str, self.offsets))
        return urllib.parse.urlencode(d, safe=",")

    def spec(self) -> str:
        return f"builtin:anchor?{self.params()}"


def iter_documents(params: str = "") -> Iterator[str]:
    """The corpus hook: the training documents of the task ``params`` describes."""
    return AnchorTask.from_params(params).documents()


def fingerprint(params: str = "") -> str:
    """The corpus hook: a hash of everything the documents depend on."""
    task = AnchorTask.from_params(params)
    blob = json.dumps({"format": _FORMAT, "params": task.params()}, sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()
