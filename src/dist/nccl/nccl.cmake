# lt_dist_nccl: the NCCL Communicator (src/dist/nccl), only in CUDA builds. NCCL comes with the CUDA
# toolkit (include/nccl.h, lib/libnccl.so); LT_NCCL_ROOT overrides where to look.
if(LT_HAVE_CUDA)
  find_path(LT_NCCL_INCLUDE nccl.h HINTS ${LT_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(LT_NCCL_LIB nccl HINTS ${LT_NCCL_ROOT}/lib ${LT_NCCL_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR}
               /usr/local/cuda/lib /usr/local/cuda/lib64)
  if(LT_NCCL_INCLUDE AND LT_NCCL_LIB)
    add_library(lt_dist_nccl STATIC ${CMAKE_CURRENT_LIST_DIR}/nccl_comm.cpp)
    target_include_directories(lt_dist_nccl PUBLIC ${PROJECT_SOURCE_DIR}/src ${LT_NCCL_INCLUDE})
    target_link_libraries(lt_dist_nccl PUBLIC lt_dist CUDA::cudart ${LT_NCCL_LIB})
    target_compile_definitions(lt_dist_nccl PUBLIC LT_HAVE_NCCL=1)
    message(STATUS "NCCL: ${LT_NCCL_LIB}")
  else()
    message(STATUS "NCCL not found: multi-GPU training (lt_dist_nccl) not built")
  endif()
endif()
