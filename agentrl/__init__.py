__version__ = "0.1.0"
# Hand-written: one star-import per chapter module, so `import agentrl as arl` exposes every
# public name of the book. Each module's __all__ is written by nbdev_export.
from .fundamentals import *
from .policies import *
from .gym import *
from .gym import _tool      # the index lists this Chapter 4 helper by its private name (Section 4.7)
from .trajectories import *
from .policy_gradient import *
from .advantages import *
from .ppo import *
from .grpo import *
from .regularization import *
from .rewards import *
from .multiturn import *
from .rollout import *
from .scaling import *
from .sft import *
from .distill import *
from .evaluation import *
from .debugging import *
from .mathtools import *
