"""The paper's measurements of one model, one module per measurement, each usable alone; they know nothing
of training, so every trainer (smallinit's, transformers', Lightning's, a plain loop) reaches them the same way.

norm_factor (RMSNorm factor, analytic and measured), sink (attention sink scores), residual_flow
(‖h_L − e‖/‖e‖ and its d-exponent), condensation (stable rank, row cosine), activations (the activation
measurements from one forward).
"""
