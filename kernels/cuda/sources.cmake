# placeholder: CUDA sources are added here
