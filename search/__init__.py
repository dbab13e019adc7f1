"""dispatchtune.search"""
