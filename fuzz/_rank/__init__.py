"""The rank side: the code that runs inside each spawned rank.

It imports only torch, the standard library and :mod:`fuzz.model` (plus the message types of
:mod:`fuzz._protocol`), never Hypothesis or the driver, so a rank's behaviour depends on the case
it is sent and nothing else.
"""
