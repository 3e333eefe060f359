"""Judging the paper: the claims (:mod:`.claims`, one registry), the verdict rule (:mod:`.verdicts`), power and
its thresholds (:mod:`.power`), the ε emulation (:mod:`.emulation`), the scaling-law fit (:mod:`.scaling`) and
the effective model size on it (:mod:`.effective_size`), the anchor probe (:mod:`.anchor`) and each recipe's
findings (:mod:`.findings`)."""
