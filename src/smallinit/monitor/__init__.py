"""The run's record and the one monitor for any training loop, below the trainer and above the measurements.

``records`` types every line of RUN/metrics.jsonl, ``metrics`` appends and reads that file, ``lock`` gives a
run folder one writer, and ``monitor`` is the :class:`Monitor`: the paper's measurements every N steps on a
fixed held-out batch, written as records there. smallinit's trainer writes through the same three and
attaches a Monitor (smallinit.train.callbacks.AnalysisCallback); the integrations attach one through their
engines' callbacks.
"""

from smallinit.monitor.monitor import Monitor, describe_model, load_snapshots, scalars

__all__ = ["Monitor", "describe_model", "load_snapshots", "scalars"]
