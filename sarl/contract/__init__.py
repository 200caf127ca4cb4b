"""The contract every reward and back end shares, below all of them: the reward interface (`RolloutBatch`,
`RewardOutput`, the registry), the reward metrics a back end logs, the token counter, the thread cap of a reward's
numerical kernels, and which rows of a voted group train. Imports nothing else of the project (docs/design.md, kept
by a test)."""
