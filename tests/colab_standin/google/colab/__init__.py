"""A stand-in for Colab's ``google.colab`` package, for tests only: ``tests/colab_standin`` goes on the
PYTHONPATH of the test's Colab-like kernel, so that ``import google.colab`` succeeds there, as in Colab.

``google`` stays a namespace package (there is no ``tests/colab_standin/google/__init__.py``), shared with
google-auth and google-api-python-client, as in a Colab runtime.

What is assumed of real Colab (read in googlecolab/colabtools, google/colab/{drive,auth,userdata}.py;
nothing here was checked against a live runtime):

- ``import google.colab`` succeeds in a Colab runtime and nowhere else.
- ``drive.mount(mountpoint)`` makes the signed-in user's My Drive appear as ``{mountpoint}/MyDrive``
  (printing ``Mounted at {mountpoint}``); it refuses a mountpoint that already holds files.
  ``drive.flush_and_unmount()`` uploads what the mount still buffers and removes the mount; with nothing
  mounted it prints ``Drive not mounted, so nothing to flush and unmount.``
- ``userdata.get(key)`` returns the secret's value; it raises ``SecretNotFoundError`` when no secret has
  that name and ``NotebookAccessError`` when the user did not grant this notebook access to it.
- ``auth.authenticate_user()`` (the non-ephemeral path) writes the signed-in user's credentials as an
  ``authorized_user`` Application Default Credentials file at ``{DATALAB_ROOT or /}content/.adc/adc.json``
  and sets ``GOOGLE_APPLICATION_CREDENTIALS`` to it. A real one holds a refresh token that google-auth
  exchanges at Google's token endpoint (for this file type google-auth ignores any other ``token_uri``),
  so the stand-in's also holds the access token the sign-in got (``COLAB_STANDIN_ACCESS_TOKEN``, valid for
  an hour), which the Drive emulator is told to accept: the file is used as Colab's would be, the refresh
  is not exercised. With ``USE_AUTH_EPHEM=1`` Colab serves credentials from its metadata server instead
  and sets no variable: not reproduced here (the package then finds them through ``google.auth.default()``).

What the test sets in the kernel's environment:

- ``COLAB_STANDIN_ROOT``: the test's temporary folder; ``mount`` refuses a mountpoint outside it, so a
  test never writes outside its own folders.
- ``COLAB_STANDIN_DRIVE``: the folder that plays the user's Drive (it holds ``MyDrive/``); ``mount``
  makes the mountpoint a symbolic link to it, ``flush_and_unmount`` removes the link.
- ``COLAB_STANDIN_SECRETS``: a JSON file ``{name: value}``; a ``null`` value is a secret the notebook
  was not granted access to.
- ``COLAB_STANDIN_ACCESS_TOKEN``: the access token ``authenticate_user`` writes; ``COLAB_STANDIN_TOKEN_URI``
  their ``token_uri`` (the Drive emulator's token endpoint; google-auth ignores it, see above) and
  ``COLAB_STANDIN_REFRESH_TOKEN`` their refresh token.
- ``COLAB_STANDIN_CALLS``: a JSON-lines file where every call is recorded (never a secret's value).
- ``DATALAB_ROOT``: as in Colab, the prefix of ``content/.adc/adc.json``.
"""

__version__ = "0.0.0+standin"
