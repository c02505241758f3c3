"""Contract checks a third-party integrator or model runs in its own test-suite.

``check_integrator(make, tmp_path)``: masked systems untouched, batch independence,
pickling, checkpoint round trip, fused == sequential (:mod:`.integrators`).
``check_model(model, structures)``: forces and stress against finite differences, batch
independence, pickling; ``check_pipeline_equals_fused(model, structures)``: a plan
split over two ranks equals the fused run bit for bit (:mod:`.models`).  Each raises
an ``AssertionError`` naming the promise that is broken.
``accelerator_path()`` runs CPU tensors through every branch a GPU takes, and
``StepProbe`` counts each step's aten operations and host reads (a GPU's syncs)
(:mod:`.accelerator`).  ``emulated_cuda_graphs()`` runs ``Simulator(cuda_graphs=True)``
on a CPU, everything but the graph itself (:mod:`.graphs`).
"""

from .accelerator import StepProbe, accelerator_path
from .graphs import emulated_cuda_graphs
from .integrators import check_integrator
from .models import check_model, check_pipeline_equals_fused

__all__ = [
    "StepProbe", "accelerator_path", "check_integrator", "check_model",
    "check_pipeline_equals_fused", "emulated_cuda_graphs",
]  # fmt: skip
