"""pcc: the precision-contract compiler for LLM reinforcement learning."""

import time as _time

__version__ = "0.1.0"
IMPORTED_AT = _time.time()  # when this process loaded pcc: pcc.convert.plan_cache keeps no plan of code changed since
