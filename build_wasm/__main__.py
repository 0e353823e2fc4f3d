import sys

from build_wasm.build import main

sys.exit(main())
