"""Init and norm forensics for any model, checkpoint or run (``smallinit audit``): what each matrix's values say
of how it was drawn (matrices), the recipe they fit (recipe), and every norm's ε and factor (audit)."""

from smallinit.auditing.audit import FAIL_ON, AuditResult, NormRow, audit, audit_path
from smallinit.auditing.matrices import MatrixRow
from smallinit.auditing.recipe import Recipe, RoleFit

__all__ = ["FAIL_ON", "AuditResult", "MatrixRow", "NormRow", "Recipe", "RoleFit", "audit", "audit_path"]
