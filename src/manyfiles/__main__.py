from manyfiles.cli import main

main()
