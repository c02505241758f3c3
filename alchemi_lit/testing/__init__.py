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
``shape_sensitive_blas()`` makes every matrix product round by its shape, as a BLAS
library's kernels may on another processor, so a value that depends on its batch mates
shows on any machine; ``count_products()`` lists the products a computation makes
(:mod:`.blas`).  ``DoubleWell`` is an analytic double-well model whose Boltzmann
marginals are known by quadrature (:mod:`.models`).  ``constraint_cases()`` gives ASE
constraint sets of every kind the framework applies, and a mix (:mod:`.constraints`).
"""

from .accelerator import StepProbe, accelerator_path
from .blas import count_products, shape_sensitive_blas
from .constraints import constraint_cases
from .graphs import emulated_cuda_graphs
from .integrators import check_integrator
from .models import DoubleWell, check_model, check_pipeline_equals_fused

__all__ = [
    "DoubleWell", "StepProbe", "accelerator_path", "check_integrator", "check_model",
    "check_pipeline_equals_fused", "constraint_cases", "count_products", "emulated_cuda_graphs",
    "shape_sensitive_blas",
]  # fmt: skip
