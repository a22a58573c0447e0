"""Judging answers with an open judge: FAC and SoPR (`scoring`), SoWR (`sowr`), and how often a judge agrees with
labelled answers (`agreement`)."""
