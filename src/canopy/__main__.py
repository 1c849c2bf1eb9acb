from canopy.cli import main

main()
