from .cli import main

if __name__ == "__main__":  # not when imported by multiprocessing's spawn
    main()
