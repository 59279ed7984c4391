print("trained")
