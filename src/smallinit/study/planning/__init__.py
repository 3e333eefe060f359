"""Planning: the named recipes (:mod:`.recipes`: a design of sweeps, run and then judged) and what a design costs
and decides before anything runs (:mod:`.plan`: its cost in :mod:`.cost`, which claims it decides in
:mod:`.decidability`, what a user sees in :mod:`.printing`)."""
