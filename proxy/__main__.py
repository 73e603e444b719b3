from brim.proxy.commands import main

raise SystemExit(main())
