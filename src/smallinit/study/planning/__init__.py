"""Planning: the named recipes (:mod:`.recipes`: a design of sweeps, run and then judged) and what a design costs
and decides before anything runs (:mod:`.plan`)."""
