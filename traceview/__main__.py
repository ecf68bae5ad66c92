from traceview.cli import main

raise SystemExit(main())
