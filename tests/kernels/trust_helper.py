"""A module the trust kernels reach through an attribute (``trust_helper.bias(...)``): the tuning key
sees it only by name, so tests edit it to change what one config elaborates to."""


def bias(block_M: int) -> float:
    return 0.0


def hang_for(block_M: int) -> bool:
    return False
