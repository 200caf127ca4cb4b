"""verl back end: config translation, the reward bridge on DataProto, and the launch."""
