"""The errors a user can cause, gathered so entry points report them in one way.

Each is raised next to the check that finds it; this module only collects them.
"""

from verispec.accept import RuleInputError
from verispec.bench.cli import BenchInputError
from verispec.bench.configs import BenchConfigError
from verispec.drafters.base import DrafterError
from verispec.engine import PromptError
from verispec.models import ModelLoadError
from verispec.prompts import PromptSetError
from verispec.sampling import SamplingError
from verispec.targets.base import TargetError
from verispec.train.loop import TrainError

USER_ERRORS: tuple[type[Exception], ...] = (
    ModelLoadError,
    DrafterError,
    PromptError,
    SamplingError,
    TargetError,
    RuleInputError,
    BenchConfigError,
    BenchInputError,
    PromptSetError,
    TrainError,
)
