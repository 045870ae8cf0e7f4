from gpulens.cli import main

main()
