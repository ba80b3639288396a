"""`pcc validate`: the seed's validation ladder (Table 6) as a command.

Each level holds more of the loop fixed than the next, so the first failing level
names the boundary where trainer and rollout first disagree (Section 6.1).
"""
