from steward.cli import main

main()
