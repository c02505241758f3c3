"""Contract checks a third-party integrator or model runs in its own test-suite.

``check_integrator(make, tmp_path)``: masked systems untouched, batch independence,
pickling, checkpoint round trip, fused == sequential (:mod:`.integrators`).
``check_model(model, structures)``: forces and stress against finite differences, batch
independence, pickling; ``check_pipeline_equals_fused(model, structures)``: a plan
split over two ranks equals the fused run bit for bit (:mod:`.models`).  Each raises
an ``AssertionError`` naming the promise that is broken.
"""

from .integrators import check_integrator
from .models import check_model, check_pipeline_equals_fused

__all__ = ["check_integrator", "check_model", "check_pipeline_equals_fused"]
